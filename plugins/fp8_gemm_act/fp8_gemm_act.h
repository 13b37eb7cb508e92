// Fp8GemmAct on the host: its attributes, the sizes of a call (the shape checks, for every caller),
// float8e4m3fn in software and the fp32 CPU kernel of the CPU execution provider.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "common/activation.h"
#include "common/attrs.h"
#include "common/op_inputs.h"
#include "deployfuse_op_specs.h"
#include "gemm_act/gemm_act.h"

namespace deployfuse {

struct Fp8GemmActAttrs {
  using Spec = spec::Fp8GemmAct;
  Act act;
  int algo;
  bool fast_accum;  // the CUDA GEMM's accumulation only: the CPU kernel accumulates in fp32 either way
  explicit Fp8GemmActAttrs(const AttrValues& a)
      : act(act_named(a.text(Spec::kActivation))),
        algo(static_cast<int>(a.integer(Spec::kAlgo))),
        fast_accum(a.integer(Spec::kFastAccum) != 0) {
    if (algo < -1) throw std::invalid_argument("algo must be -1 (the heuristic's choice) or a candidate index >= 0");
  }

  using Sizes = GemmActAttrs::Sizes;  // m, n, k: X [..., K] as [m, k], W [n, k], Y [..., N] as [m, n]
  // From X, XScale, W, WScale, Bias; throws std::invalid_argument saying what does not fit.
  Sizes sizes(const Inputs& in) const {
    const Tensor &x = in[0], &w = in[2];
    if (x.rank < 1 || w.rank != 2 || w.dims[1] != x.dims[x.rank - 1]) throw std::invalid_argument("X must be [..., K] and W [N, K]");
    if (in[1].elements() != 1 || in[3].elements() != 1) throw std::invalid_argument("XScale and WScale must be scalars (one element)");
    const Sizes s{x.size(0, x.rank - 1), w.dims[0], w.dims[1]};
    if (in[4].elements() != s.n && in[4].elements() != 0) throw std::invalid_argument("Bias must have W's N elements, or none (no bias)");
    return s;
  }
};

// float8e4m3fn (1 sign, 4 exponent bits biased by 7, 3 mantissa bits; no infinities, S.1111.111 = NaN)
// as the function body's Cast (saturate=1) writes it: round to nearest even, |v| beyond 448
// (infinities too) to ±448, NaN to NaN.
uint8_t e4m3_from_float(float v);
float e4m3_to_float(uint8_t v);

// y[m, n] = act(dq(q(x, x_scale)) @ dq(w, w_scale)^T + bias) with q(x, s) = e4m3(x / s), dq(v, s) = v * s
// in fp32; w: float8e4m3fn [n, k]; bias null: none.
void fp8_gemm_act_cpu(const float* x, float x_scale, const uint8_t* w, float w_scale, const float* bias, float* y, int64_t m, int64_t n,
                      int64_t k, Act act);

}  // namespace deployfuse
