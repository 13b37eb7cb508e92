// GroupNormAct on the host: its attributes (read once, for both runtimes' adapters) and the fp32
// CPU kernel of the CPU execution provider.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "common/activation.h"
#include "common/attrs.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {

struct GroupNormActAttrs {
  using Spec = spec::GroupNormAct;
  int64_t groups;
  float epsilon;
  Act act;
  explicit GroupNormActAttrs(const AttrValues& a)
      : groups(a.integer(Spec::kNumGroups)), epsilon(a.real(Spec::kEpsilon)), act(act_named(a.text(Spec::kActivation))) {
    if (groups <= 0) throw std::invalid_argument("num_groups must be positive");
  }
};

// x, y: [n, channels, spatial]; scale, bias: [channels].
void group_norm_act_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t n, int64_t channels, int64_t spatial,
                        int64_t groups, float epsilon, Act act);

}  // namespace deployfuse
