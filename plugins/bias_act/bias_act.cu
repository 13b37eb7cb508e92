// Elementwise with 16-byte vector loads/stores when X and Y are 16-byte aligned (the usual case
// for framework allocations), a scalar tail for the last total % (16 / sizeof(T)) elements, and a
// scalar kernel otherwise. The bias column is computed once per vector and then stepped.
#include "bias_act/bias_act.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/cuda_check.h"
#include "common/dtype.cuh"

namespace deployfuse {
namespace {

constexpr int kThreads = 256;

template <typename T>
struct alignas(16) Vec {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

template <typename T>
__global__ void __launch_bounds__(kThreads) bias_act_vec_kernel(const Vec<T>* __restrict__ x, const T* __restrict__ bias,
                                                                Vec<T>* __restrict__ y, int64_t vectors, int64_t cols, Act act) {
  constexpr int kSize = Vec<T>::kSize;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    Vec<T> in = x[i], out;
    int64_t col = (i * kSize) % cols;
#pragma unroll
    for (int k = 0; k < kSize; ++k) {
      out.v[k] = from_float<T>(apply_act(act, to_float(in.v[k]) + to_float(__ldg(bias + col))));
      if (++col == cols) col = 0;
    }
    y[i] = out;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) bias_act_scalar_kernel(const T* __restrict__ x, const T* __restrict__ bias,
                                                                   T* __restrict__ y, int64_t begin, int64_t total, int64_t cols,
                                                                   Act act) {
  for (int64_t i = begin + blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    y[i] = from_float<T>(apply_act(act, to_float(x[i]) + to_float(bias[i % cols])));
  }
}

unsigned grid_for(int64_t work) {
  int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 132 * 32 ? (blocks > 0 ? blocks : 1) : 132 * 32);  // grid-stride beyond ~32 blocks/SM
}

}  // namespace

template <typename T>
cudaError_t launch_bias_act(cudaStream_t stream, const T* x, const T* bias, T* y, int64_t total, int64_t cols, Act act) {
  if (total == 0) return cudaSuccess;
  if (cols <= 0) return cudaErrorInvalidValue;
  constexpr int kSize = Vec<T>::kSize;
  const bool aligned = (reinterpret_cast<uintptr_t>(x) % 16 == 0) && (reinterpret_cast<uintptr_t>(y) % 16 == 0);
  int64_t done = 0;
  if (aligned) {
    const int64_t vectors = total / kSize;
    if (vectors > 0) {
      bias_act_vec_kernel<T><<<grid_for(vectors), kThreads, 0, stream>>>(reinterpret_cast<const Vec<T>*>(x), bias,
                                                                         reinterpret_cast<Vec<T>*>(y), vectors, cols, act);
      DF_RETURN_IF_ERROR(cudaGetLastError());
    }
    done = vectors * kSize;
  }
  if (done < total) {
    bias_act_scalar_kernel<T><<<grid_for(total - done), kThreads, 0, stream>>>(x, bias, y, done, total, cols, act);
    DF_RETURN_IF_ERROR(cudaGetLastError());
  }
  return cudaSuccess;
}

template cudaError_t launch_bias_act<float>(cudaStream_t, const float*, const float*, float*, int64_t, int64_t, Act);
template cudaError_t launch_bias_act<__half>(cudaStream_t, const __half*, const __half*, __half*, int64_t, int64_t, Act);
template cudaError_t launch_bias_act<__nv_bfloat16>(cudaStream_t, const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t, int64_t, Act);

}  // namespace deployfuse
