// GemmAct on the host: its attributes (read once, for both runtimes' adapters), the sizes of a
// call (the shape checks, for every caller) and the fp32 CPU kernel of the CPU execution provider.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "common/activation.h"
#include "common/attrs.h"
#include "common/op_inputs.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {

struct GemmActAttrs {
  using Spec = spec::GemmAct;
  Act act;
  int algo;
  explicit GemmActAttrs(const AttrValues& a) : act(act_named(a.text(Spec::kActivation))), algo(static_cast<int>(a.integer(Spec::kAlgo))) {
    if (algo < -1) throw std::invalid_argument("algo must be -1 (the heuristic's choice) or a candidate index >= 0");
  }

  struct Sizes {
    int64_t m, n, k;  // X [..., K] as [m, k], W [k, n], Y [..., N] as [m, n]
  };
  // From X, W, Bias [, Residual]; throws std::invalid_argument saying what does not fit.
  Sizes sizes(const Inputs& in) const {
    const Tensor &x = in[0], &w = in[1];
    if (x.rank < 1 || w.rank != 2 || w.dims[0] != x.dims[x.rank - 1]) throw std::invalid_argument("X must be [..., K] and W [K, N]");
    const Sizes s{x.size(0, x.rank - 1), w.dims[1], w.dims[0]};
    if (in[2].elements() != s.n) throw std::invalid_argument("Bias must have W's N elements");
    if (in.count() > 3) {
      const Tensor& r = in[3];
      bool same = r.rank == x.rank && r.dims[r.rank - 1] == s.n;
      for (int i = 0; same && i < x.rank - 1; ++i) same = r.dims[i] == x.dims[i];
      if (!same) throw std::invalid_argument("Residual must have Y's shape [..., N]");
    }
    return s;
  }
};

// y[m, n] = act(x[m, k] @ w[k, n] + bias[n] (+ residual[m, n])); bias and residual may be null (none added).
void gemm_act_cpu(const float* x, const float* w, const float* bias, const float* residual, float* y, int64_t m, int64_t n, int64_t k,
                  Act act);

}  // namespace deployfuse
