// FusedMHA on the host: its attributes (read once, for both runtimes' adapters) and the fp32 CPU
// kernel of the CPU execution provider.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "common/attrs.h"
#include "common/mha_shape.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {

struct FusedMHAAttrs {
  using Spec = spec::FusedMHA;
  int64_t heads;
  float scale;
  bool causal;
  explicit FusedMHAAttrs(const AttrValues& a)
      : heads(a.integer(Spec::kNumHeads)), scale(a.real(Spec::kScale)), causal(a.integer(Spec::kCausal) != 0) {
    if (heads <= 0) throw std::invalid_argument("num_heads must be positive");
  }
};

// mask may be null.
void fused_mha_cpu(const float* q, const float* k, const float* v, const float* mask, float* y, const MhaShape& s);

}  // namespace deployfuse
