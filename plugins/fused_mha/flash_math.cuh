// What both tensor-core FusedMHA kernels (fused_mha_tc.cu, fused_mha_sm90.cu) do with a score tile in
// registers: the online softmax in base 2 (x * log2(e), then 2^x) and the re-packing of P as MMA
// operands. A score tile of N columns sits in the m16n8 accumulator layout, flat: lane 4 g + t holds
// s[4 i + 2 r + c] = (row g + 8 r, column 8 i + 2 t + c); a row's values are spread over the 4 lanes
// of a quad.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/vec_math.cuh"

namespace deployfuse {

constexpr float kLog2e = 1.4426950408889634f;

// (lo, hi) as the low and high halves of one register, T = __half or __nv_bfloat16.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
  if constexpr (std::is_same_v<T, __half>) return __half22float2(*reinterpret_cast<const __half2*>(&v));
  else return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}

// Online softmax of row r (0: g, 1: g + 8) of the tile s, x = s * mul in log2 units:
//   m' = max(m, rowmax x);  s <- P = 2^(x - m');  l <- l * 2^(m - m') + rowsum P (this thread's columns
//   only: the quad is summed at the end); returns alpha = 2^(m - m'), the factor for O.
// A row masked so far (m' = -inf) gets P = 0 without inf - inf.
template <int kHalf>
__device__ __forceinline__ float online_softmax_row(float (&s)[kHalf], int r, float mul, float& m, float& l) {
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kHalf / 4; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  mx = fmaxf(m, mx * mul);
  const float base = mx == -INFINITY ? 0.f : mx;
  const float alpha = ex2_ftz(m - base);  // 2^-inf = 0
  m = mx;
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kHalf / 4; ++i) {
    s[4 * i + 2 * r] = ex2_ftz(fmaf(s[4 * i + 2 * r], mul, -base));
    s[4 * i + 2 * r + 1] = ex2_ftz(fmaf(s[4 * i + 2 * r + 1], mul, -base));
    sum += s[4 * i + 2 * r] + s[4 * i + 2 * r + 1];
  }
  l = l * alpha + sum;
  return alpha;
}

// Columns [16 kk, 16 kk + 16) of P as the m16k16 A fragment of an MMA: the accumulator layout of two
// n8 tiles is that fragment's layout.
template <typename T, int kHalf>
__device__ __forceinline__ void p_fragment(const float (&s)[kHalf], int kk, uint32_t (&a)[4]) {
  a[0] = pack2<T>(s[8 * kk], s[8 * kk + 1]);
  a[1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
  a[2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
  a[3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
}

// 1 / l of a row from the quad's partial sums (0 where every key was masked, l == 0).
__device__ __forceinline__ float row_inverse_sum(float l) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  return l > 0.f ? 1.f / l : 0.f;
}

}  // namespace deployfuse
