// Elementwise, four paths:
// - fp32 with cols % 4 == 0 (X, Y, Bias 16-byte aligned): flat, four vectors a thread,
//   the bias vector by a 32-bit remainder (H200, 8192x16384 gelu: 0.262 ms against 0.276 for the
//   rows kernel below; 16-bit data gained nothing, bf16 lost 3 %);
// - rows of whole 16-byte vectors (cols % (16 / sizeof(T)) == 0, X, Y, Bias 16-byte aligned,
//   at least 64 vectors a row): a thread owns one column vector, keeps that slice of Bias in
//   registers and walks down the rows, four rows in flight; no index division at all;
// - other aligned tensors: 16-byte vectors of X/Y with the bias column stepped per element;
// - otherwise (and for the tail) a scalar kernel.
// The vector paths use the fast-intrinsic activations (common/activation.h, act_fast).
#include "bias_act/bias_act.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/dtype.cuh"

namespace deployfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kMinColumnVectors = 64;

template <typename T, Act kAct>
__device__ __forceinline__ Vec<T> bias_act_vec(const Vec<T>& in, const float (&b)[Vec<T>::kSize]) {
  Vec<T> out;
#pragma unroll
  for (int k = 0; k < Vec<T>::kSize; ++k) out.v[k] = from_float<T>(act_fast<kAct>(to_float(in.v[k]) + b[k]));
  return out;
}

template <typename T, Act kAct>
__global__ void __launch_bounds__(kThreads) bias_act_rows_kernel(const Vec<T>* __restrict__ x, const Vec<T>* __restrict__ bias,
                                                                 Vec<T>* __restrict__ y, int64_t rows, int64_t col_vectors) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= col_vectors) return;
  float b[Vec<T>::kSize];
  const Vec<T> bv = bias[c];
#pragma unroll
  for (int k = 0; k < Vec<T>::kSize; ++k) b[k] = to_float(bv.v[k]);
  const int64_t step = gridDim.y;
  int64_t r = blockIdx.y;
  for (; r + 3 * step < rows; r += 4 * step) {  // four loads in flight before the first use
    Vec<T> a[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) a[u] = x[(r + u * step) * col_vectors + c];
#pragma unroll
    for (int u = 0; u < 4; ++u) y[(r + u * step) * col_vectors + c] = bias_act_vec<T, kAct>(a[u], b);
  }
  for (; r < rows; r += step) y[r * col_vectors + c] = bias_act_vec<T, kAct>(x[r * col_vectors + c], b);
}

// Flat (fp32): block b owns vectors [b * kThreads * kFlat, (b + 1) * kThreads * kFlat), thread t the
// vectors t + k * kThreads (coalesced), each bias vector found by one 32-bit remainder.
constexpr int kFlat = 4;
template <typename T, Act kAct>
__global__ void __launch_bounds__(kThreads) bias_act_flat_kernel(const Vec<T>* __restrict__ x, const Vec<T>* __restrict__ bias,
                                                                 Vec<T>* __restrict__ y, int64_t vectors, unsigned col_vectors) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kFlat + threadIdx.x;
  Vec<T> a[kFlat];
#pragma unroll
  for (int k = 0; k < kFlat; ++k) {
    if (base + k * kThreads < vectors) a[k] = x[base + k * kThreads];
  }
#pragma unroll
  for (int k = 0; k < kFlat; ++k) {
    const int64_t i = base + k * kThreads;
    if (i < vectors) {
      const Vec<T> bv = bias[static_cast<unsigned>(i) % col_vectors];
      float b[Vec<T>::kSize];
#pragma unroll
      for (int e = 0; e < Vec<T>::kSize; ++e) b[e] = to_float(bv.v[e]);
      y[i] = bias_act_vec<T, kAct>(a[k], b);
    }
  }
}

template <typename T, Act kAct>
__global__ void __launch_bounds__(kThreads) bias_act_vec_kernel(const Vec<T>* __restrict__ x, const T* __restrict__ bias,
                                                                Vec<T>* __restrict__ y, int64_t vectors, int64_t cols) {
  constexpr int kSize = Vec<T>::kSize;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float b[kSize];
    int64_t col = (i * kSize) % cols;
#pragma unroll
    for (int k = 0; k < kSize; ++k) {
      b[k] = to_float(__ldg(bias + col));
      if (++col == cols) col = 0;
    }
    y[i] = bias_act_vec<T, kAct>(x[i], b);
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
  const bool aligned = aligned16(x) && aligned16(y);
  if constexpr (std::is_same_v<T, float>) {
    if (aligned && cols % kSize == 0 && aligned16(bias) && total / kSize <= UINT_MAX) {
      const int64_t vectors = total / kSize;
      const unsigned blocks = static_cast<unsigned>((vectors + kThreads * kFlat - 1) / (kThreads * kFlat));
      with_act(act, [&](auto a) {
        bias_act_flat_kernel<T, decltype(a)::value><<<blocks, kThreads, 0, stream>>>(
            reinterpret_cast<const Vec<T>*>(x), reinterpret_cast<const Vec<T>*>(bias), reinterpret_cast<Vec<T>*>(y), vectors,
            static_cast<unsigned>(cols / kSize));
        return 0;
      });
      return cudaGetLastError();
    }
  }
  if (aligned && cols % kSize == 0 && aligned16(bias) && cols / kSize >= kMinColumnVectors) {
    const int64_t col_vectors = cols / kSize, rows = total / cols;
    const unsigned gx = static_cast<unsigned>((col_vectors + kThreads - 1) / kThreads);
    const int64_t want_y = (132 * 16 + gx - 1) / gx;  // ~16 blocks per SM
    const dim3 grid(gx, static_cast<unsigned>(rows < want_y ? rows : (want_y < 65535 ? want_y : 65535)));
    with_act(act, [&](auto a) {
      bias_act_rows_kernel<T, decltype(a)::value><<<grid, kThreads, 0, stream>>>(
          reinterpret_cast<const Vec<T>*>(x), reinterpret_cast<const Vec<T>*>(bias), reinterpret_cast<Vec<T>*>(y), rows, col_vectors);
      return 0;
    });
    return cudaGetLastError();
  }
  int64_t done = 0;
  if (aligned) {
    const int64_t vectors = total / kSize;
    if (vectors > 0) {
      with_act(act, [&](auto a) {
        bias_act_vec_kernel<T, decltype(a)::value><<<grid_for(vectors), kThreads, 0, stream>>>(
            reinterpret_cast<const Vec<T>*>(x), bias, reinterpret_cast<Vec<T>*>(y), vectors, cols);
        return 0;
      });
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
