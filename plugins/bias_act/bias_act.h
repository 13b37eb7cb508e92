// BiasAct on the host: its attributes (read once, for both runtimes), the sizes of a call (for
// every caller) and the fp32 CPU kernel of the CPU execution provider.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "common/activation.h"
#include "common/attrs.h"
#include "common/op_inputs.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {

struct BiasActAttrs {
  using Spec = spec::BiasAct;
  Act act;
  explicit BiasActAttrs(const AttrValues& a) : act(act_named(a.text(Spec::kActivation))) {}

  struct Sizes {
    int64_t total, cols;  // X, Y: [total / cols, cols]
  };
  Sizes sizes(const Inputs& in) const {
    const Tensor& x = in[0];
    const int64_t cols = x.rank == 0 ? 1 : x.dims[x.rank - 1];
    if (in[1].elements() != cols) throw std::invalid_argument("Bias must have the size of X's last axis");
    return {x.elements(), cols};
  }
};

// x, y: [total / cols, cols]; bias: [cols].
void bias_act_cpu(const float* x, const float* bias, float* y, int64_t total, int64_t cols, Act act);

inline void run_cpu(const BiasActAttrs& a, const BiasActAttrs::Sizes& s, const Inputs& in, float* y) {
  bias_act_cpu(in[0].as<float>(), in[1].as<float>(), y, s.total, s.cols, a.act);
}

}  // namespace deployfuse
