// GroupNormAct on the host: its attributes (read once, for both runtimes), the sizes of a call
// (for every caller) and the fp32 CPU kernel of the CPU execution provider.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "common/activation.h"
#include "common/attrs.h"
#include "common/op_inputs.h"
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

  struct Sizes {
    int64_t n, channels, spatial;  // X, Y: [n, channels, spatial]
  };
  Sizes sizes(const Inputs& in) const {
    const Tensor& x = in[0];
    if (x.rank < 2) throw std::invalid_argument("X must be [N, C, ...]");
    if (x.dims[1] % groups != 0) throw std::invalid_argument("channels not divisible by num_groups");
    return {x.dims[0], x.dims[1], x.size(2, x.rank)};
  }
};

// x, y: [n, channels, spatial]; scale, bias: [channels].
void group_norm_act_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t n, int64_t channels, int64_t spatial,
                        int64_t groups, float epsilon, Act act);

inline void run_cpu(const GroupNormActAttrs& a, const GroupNormActAttrs::Sizes& s, const Inputs& in, float* y) {
  group_norm_act_cpu(in[0].as<float>(), in[1].as<float>(), in[2].as<float>(), y, s.n, s.channels, s.spatial, a.groups, a.epsilon, a.act);
}

}  // namespace deployfuse
