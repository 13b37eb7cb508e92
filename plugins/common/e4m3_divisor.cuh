// x / s for the float8 copies the kernels write (SkipLayerNormFp8's and FusedMHA's YQ, Fp8GemmAct's quantize pass): the correctly
// rounded quotient that QuantizeLinear, the CPU kernels and the function bodies compute, by a multiply wherever that gives the
// same float.
//
// When s = 2^e and 1/s = 2^-e is a normal float, 1/s is exact, so x · (1/s) and x / s are both the real number x · 2^-e rounded
// once: the same bits, subnormal results included. deployfuse's fp8 activation scales are powers of two
// (deployfuse/quantize/qdq.py, fp8_activation_scales), so its artefacts take the multiply; any other scale keeps the division
// (MUFU.RCP, a correction and a range check: 0.27 of SkipLayerNormFp8's 3.18 us at 1024 x 768 on the H100,
// bench/results/h200_quant.md section 12). The branch is uniform: every thread of a launch reads the same scale.
#pragma once
#include <cstdint>

namespace deployfuse {

class E4m3Divisor {
 public:
  // One division a thread, where the kernel begins: value_ is 1/s for the multiply, else s (two registers live, not three).
  __device__ __forceinline__ explicit E4m3Divisor(float scale)
      : by_inverse_(exact_inverse(scale)), value_(by_inverse_ ? 1.f / scale : scale) {}

  __device__ __forceinline__ float2 divide(float a, float b) const {
    if (by_inverse_) return make_float2(a * value_, b * value_);
    return make_float2(a / value_, b / value_);
  }
  __device__ __forceinline__ float divide(float a) const {
    if (by_inverse_) return a * value_;
    return a / value_;
  }

 private:
  // s = 2^e with e in [-126, 126]: its mantissa bits are zero and its biased exponent in [1, 253], so 1/s is normal too.
  __device__ __forceinline__ static bool exact_inverse(float s) {
    const uint32_t bits = __float_as_uint(s), exponent = (bits >> 23) & 0xffu;
    return (bits & 0x7fffffu) == 0 && exponent >= 1 && exponent <= 253;
  }

  bool by_inverse_;
  float value_;
};

}  // namespace deployfuse
