// Lean per-element helpers for the vectorised LayerNormGelu / GroupNormAct kernels, where the
// instruction count per element, not memory, set the pace of 16-bit data (round 3: 42 SASS
// instructions an element, most of them the denormal fix-ups of __expf / __fdividef).
// - Pairs: two elements of a 16-byte vector <-> float2 with one packed conversion where the
//   type has one (cvt.rn.f16x2.f32 / cvt.rn.bf16x2.f32 for the stores).
// - Activations in fp32 with single MUFU ops (ex2/rcp .approx.ftz: relative error ~2^-22; a
//   denormal result flushes to 0, far below the 16-bit outputs' resolution and the fp32 tolerance).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/activation.h"
#include "common/dtype.cuh"

namespace deployfuse {

__device__ __forceinline__ float ex2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float rcp_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// 16 bytes (e.g. from ld_shared_v4, common/shared_mem.cuh) as a vector of T.
template <typename T>
__device__ __forceinline__ Vec<T> as_vec(uint4 w) {
  Vec<T> v;
  *reinterpret_cast<uint4*>(v.v) = w;
  return v;
}

// Elements 2k, 2k+1 of v as floats.
__device__ __forceinline__ float2 pair_to_float2(const Vec<float>& v, int k) { return make_float2(v.v[2 * k], v.v[2 * k + 1]); }
__device__ __forceinline__ float2 pair_to_float2(const Vec<__half>& v, int k) {
  return __half22float2(reinterpret_cast<const __half2*>(v.v)[k]);
}
__device__ __forceinline__ float2 pair_to_float2(const Vec<__nv_bfloat16>& v, int k) {
  const unsigned u = reinterpret_cast<const unsigned*>(v.v)[k];  // bf16 = the top half of an fp32
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// Hides v's value from the optimiser (no instruction): the next pass converts the 16-bit data
// again (one instruction an element) instead of keeping the previous pass's floats alive, which
// doubled the registers of the 16-vector slices.
template <typename T>
__device__ __forceinline__ void opaque(Vec<T>& v) {
  unsigned* w = reinterpret_cast<unsigned*>(v.v);
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(w[i]));
}

// Elements 2k, 2k+1 of v = (a, b), rounded to nearest.
__device__ __forceinline__ void set_pair(Vec<float>& v, int k, float a, float b) {
  v.v[2 * k] = a;
  v.v[2 * k + 1] = b;
}
__device__ __forceinline__ void set_pair(Vec<__half>& v, int k, float a, float b) {
  reinterpret_cast<__half2*>(v.v)[k] = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void set_pair(Vec<__nv_bfloat16>& v, int k, float a, float b) {
  reinterpret_cast<__nv_bfloat162*>(v.v)[k] = __floats2bfloat162_rn(a, b);
}

// act(x) for the vector paths.
// gelu: erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7) on a = |x| / sqrt 2:
//   erf(a) = 1 - t P(t) e^(-a^2), t = 1 / (1 + p a). With h = t P(t) e^(-x^2 / 2) / 2,
//   gelu(x) = x (1 + erf(x / sqrt 2)) / 2 = x - |x| h for x >= 0 and x h for x < 0, i.e.
//   max(x, 0) - |x| h: no 1 - (1 - small) cancellation for negative x. (0.5 folded into P.)
// gelu_tanh: x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): x / (1 + 2^(x (k1 + k2 x^2))),
//   k1 = -2 sqrt(2/pi) log2(e), k2 = 0.044715 k1.
// silu / sigmoid: x / (1 + 2^(-x log2 e)), 1 / (1 + 2^(-x log2 e)).
template <Act kAct>
__device__ __forceinline__ float act_lean(float x) {
  if constexpr (kAct == Act::kRelu) return fmaxf(x, 0.f);
  if constexpr (kAct == Act::kGelu) {
    const float ax = fabsf(x);
    const float t = rcp_ftz(fmaf(0.2316418882663604f, ax, 1.f));  // p / sqrt 2
    const float p = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 0.5307027145f, -0.7265760135f), 0.7107068705f), -0.142248368f), 0.127414796f);
    const float e = ex2_ftz(x * x * -0.7213475204444817f);  // e^(-x^2 / 2)
    return fmaf(-ax, p * e, fmaxf(x, 0.f));
  }
  if constexpr (kAct == Act::kGeluTanh) {
    return x * rcp_ftz(1.f + ex2_ftz(x * fmaf(-0.1029432395800235f, x * x, -2.302208198144325f)));
  }
  if constexpr (kAct == Act::kSilu) return x * rcp_ftz(1.f + ex2_ftz(x * -1.4426950408889634f));
  if constexpr (kAct == Act::kSigmoid) return rcp_ftz(1.f + ex2_ftz(x * -1.4426950408889634f));
  return x;
}

// silu(x) with one MUFU op instead of two, for kernels whose activations are bound by the MUFU
// pipe (16 results a clock an SM, against 128 FMAs): u = 2^(-|x| log2 e) in (0, 1],
// 1 / (1 + u) by a degree-5 minimax polynomial on [0, 1] (relative error 5.1e-5 = 2^-14.3: for
// 16-bit outputs), and silu(x) = x / (1 + u) for x >= 0, x u / (1 + u) for x < 0, i.e.
// max(x, x u) / (1 + u): no cancellation for negative x.
__device__ __forceinline__ float silu_one_mufu(float x) {
  const float u = ex2_ftz(fabsf(x) * -1.4426950408889634f);
  const float q = fmaf(fmaf(fmaf(fmaf(fmaf(-0.104481466f, u, 0.417926311f), u, -0.77055794f), u, 0.953412592f), u, -0.996273935f), u,
                       0.999948859f);
  return fmaxf(x, x * u) * q;
}

}  // namespace deployfuse
