// Fp8Mlp on the host: its attributes, the sizes of a call (the shape checks, for every caller) and the fp32 CPU kernel of
// the CPU execution provider, Fp8GemmAct's CPU kernel twice.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "common/activation.h"
#include "common/attrs.h"
#include "common/op_inputs.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {

struct Fp8MlpAttrs {
  using Spec = spec::Fp8Mlp;
  Act act;           // FC1's
  int algo1, algo2;  // FC1's and FC2's cuBLASLt candidate, as Fp8GemmAct's algo (the CPU kernel has none)
  bool fast_accum;   // the CUDA GEMMs' accumulation only: the CPU kernel accumulates in fp32 either way
  explicit Fp8MlpAttrs(const AttrValues& a)
      : act(act_named(a.text(Spec::kActivation))),
        algo1(static_cast<int>(a.integer(Spec::kAlgo1))),
        algo2(static_cast<int>(a.integer(Spec::kAlgo2))),
        fast_accum(a.integer(Spec::kFastAccum) != 0) {
    if (algo1 < -1 || algo2 < -1)
      throw std::invalid_argument("algo1 and algo2 must be -1 (the heuristic's choice) or a candidate index >= 0");
  }

  struct Sizes {
    int64_t m, k, n1, n2;  // X [..., K] as [m, k], W1 [n1, k], W2 [n2, n1], Y [..., N2] as [m, n2]
  };
  // From X, XScale, W1, W1Scale, B1, HScale, W2, W2Scale, B2; throws std::invalid_argument saying what does not fit.
  Sizes sizes(const Inputs& in) const {
    const Tensor &x = in[0], &w1 = in[2], &w2 = in[6];
    if (x.rank < 1 || w1.rank != 2 || w1.dims[1] != x.dims[x.rank - 1]) throw std::invalid_argument("X must be [..., K] and W1 [N1, K]");
    if (w2.rank != 2 || w2.dims[1] != w1.dims[0]) throw std::invalid_argument("W2 must be [N2, N1] for W1's N1");
    for (int scale : {1, 3, 5, 7})
      if (in[scale].elements() != 1) throw std::invalid_argument("XScale, W1Scale, HScale and W2Scale must be scalars (one element)");
    const Sizes s{x.size(0, x.rank - 1), w1.dims[1], w1.dims[0], w2.dims[0]};
    if (in[4].elements() != s.n1 && in[4].elements() != 0) throw std::invalid_argument("B1 must have W1's N1 elements, or none (no bias)");
    if (in[8].elements() != s.n2 && in[8].elements() != 0) throw std::invalid_argument("B2 must have W2's N2 elements, or none (no bias)");
    return s;
  }
};

// y[m, n2] = dq(h, h_scale) @ dq(w2, w2_scale)^T + b2 with h = q(act(dq(q(x, x_scale)) @ dq(w1, w1_scale)^T + b1), h_scale), in
// fp32: h is quantized from FC1's fp32 result (never rounded to T), as the CUDA epilogue writes it. w1: float8e4m3fn [n1, k],
// w2: [n2, n1]; b1, b2 null: none.
void fp8_mlp_cpu(const float* x, float x_scale, const uint8_t* w1, float w1_scale, const float* b1, float h_scale, const uint8_t* w2,
                 float w2_scale, const float* b2, float* y, const Fp8MlpAttrs::Sizes& s, Act act);

}  // namespace deployfuse
