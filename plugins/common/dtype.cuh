// float <-> storage type conversions for the CUDA kernels (fp32 math on fp32/fp16/bf16 data).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace deployfuse {

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// 16 bytes of T: the unit of the vectorised kernels (8 halves / bf16s, 4 floats).
template <typename T>
struct alignas(16) Vec {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Sum over the warp; every lane gets the total.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// Safe to call repeatedly: the first barrier keeps a previous call's readers off the scratch.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float s_warp[32];
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) s_warp[warp] = v;
  __syncthreads();
  return warp_sum(lane < static_cast<int>(blockDim.x >> 5) ? s_warp[lane] : 0.f);
}

// Welford running statistics; merge() is Chan's parallel combination.
struct Welford {
  float mean = 0.f, m2 = 0.f, count = 0.f;
  __device__ __forceinline__ void add(float x) {
    count += 1.f;
    float d = x - mean;
    mean += d / count;
    m2 += d * (x - mean);
  }
  __device__ __forceinline__ void merge(float o_mean, float o_m2, float o_count) {
    if (o_count == 0.f) return;
    float n = count + o_count, d = o_mean - mean;
    mean += d * (o_count / n);
    m2 += o_m2 + d * d * (count * o_count / n);
    count = n;
  }
};

// Block-wide Welford reduction; every thread gets the row's (mean, variance).
template <int kThreads>
__device__ __forceinline__ void block_mean_var(Welford w, float* mean, float* var) {
  __shared__ float s_mean[32], s_m2[32], s_n[32];
  for (int off = 16; off > 0; off >>= 1) {
    float om = __shfl_xor_sync(0xffffffffu, w.mean, off);
    float o2 = __shfl_xor_sync(0xffffffffu, w.m2, off);
    float on = __shfl_xor_sync(0xffffffffu, w.count, off);
    w.merge(om, o2, on);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { s_mean[warp] = w.mean; s_m2[warp] = w.m2; s_n[warp] = w.count; }
  __syncthreads();
  if (warp == 0) {
    Welford t;
    if (lane < kThreads / 32) { t.mean = s_mean[lane]; t.m2 = s_m2[lane]; t.count = s_n[lane]; }
    for (int off = 16; off > 0; off >>= 1) {
      float om = __shfl_xor_sync(0xffffffffu, t.mean, off);
      float o2 = __shfl_xor_sync(0xffffffffu, t.m2, off);
      float on = __shfl_xor_sync(0xffffffffu, t.count, off);
      t.merge(om, o2, on);
    }
    if (lane == 0) { s_mean[0] = t.mean; s_m2[0] = t.count > 0.f ? t.m2 / t.count : 0.f; }
  }
  __syncthreads();
  *mean = s_mean[0];
  *var = s_m2[0];
}

}  // namespace deployfuse
