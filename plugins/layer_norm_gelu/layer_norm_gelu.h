// LayerNormGelu on the host: its attributes (read once, for both runtimes' adapters) and the fp32
// CPU kernel of the CPU execution provider.
#pragma once
#include <cstdint>

#include "common/attrs.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {

struct LayerNormGeluAttrs {
  using Spec = spec::LayerNormGelu;
  int64_t axis;
  float epsilon;
  bool tanh_approx;
  explicit LayerNormGeluAttrs(const AttrValues& a)
      : axis(a.integer(Spec::kAxis)), epsilon(a.real(Spec::kEpsilon)), tanh_approx(a.text(Spec::kApproximate) == "tanh") {}
};

// x, y: [rows, cols]; scale, bias: [cols]. Two-pass mean/variance in double per row.
void layer_norm_gelu_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t rows, int64_t cols, float epsilon,
                         bool tanh_approx);

}  // namespace deployfuse
