// Two paths. Rows of whole 16-byte vectors (cols % (16 / sizeof(T)) == 0, all pointers 16-byte
// aligned, cols <= 4096 vectors): one block per row holds the row in registers (kVecs 16-byte
// vectors a thread, in the storage type), so X is read once; mean, then the sum of squared deviations from it (exact two-pass
// statistics, both from registers), then normalise + GELU (fast intrinsics) and 16-byte stores.
// Otherwise: Welford statistics over the row, then a second sweep (from L1/L2).
#include "layer_norm_gelu/layer_norm_gelu.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/activation.h"
#include "common/cuda_check.h"
#include "common/dtype.cuh"

namespace deployfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVecThreads = 512;
constexpr int kRowThreads = 128;

template <typename T, int kVecs, Act kAct>
__global__ void __launch_bounds__(kMaxVecThreads) layer_norm_gelu_vec_kernel(const Vec<T>* __restrict__ x, const Vec<T>* __restrict__ scale,
                                                                             const Vec<T>* __restrict__ bias, Vec<T>* __restrict__ y,
                                                                             int col_vectors, float inv_cols, float epsilon) {
  constexpr int K = Vec<T>::kSize;
  const Vec<T>* row = x + static_cast<int64_t>(blockIdx.x) * col_vectors;
  Vec<T>* out = y + static_cast<int64_t>(blockIdx.x) * col_vectors;
  Vec<T> v[kVecs];  // the row slice stays in its storage type: half the registers for 16-bit data
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c < col_vectors) v[j] = row[c];
  }
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (threadIdx.x + j * blockDim.x < col_vectors) {
#pragma unroll
      for (int k = 0; k < K; ++k) sum += to_float(v[j].v[k]);
    }
  }
  const float mean = block_sum(sum) * inv_cols;
  float sq = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (threadIdx.x + j * blockDim.x < col_vectors) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float d = to_float(v[j].v[k]) - mean;
        sq = fmaf(d, d, sq);
      }
    }
  }
  const float inv_std = rsqrtf(block_sum(sq) * inv_cols + epsilon);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c < col_vectors) {
      const Vec<T> s = scale[c], b = bias[c];
      Vec<T> o;
#pragma unroll
      for (int k = 0; k < K; ++k) o.v[k] = from_float<T>(act_fast<kAct>(fmaf((to_float(v[j].v[k]) - mean) * inv_std, to_float(s.v[k]), to_float(b.v[k]))));
      out[c] = o;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) layer_norm_gelu_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                                                                   const T* __restrict__ bias, T* __restrict__ y,
                                                                   int64_t cols, float epsilon, Act act) {
  const T* row = x + blockIdx.x * cols;
  T* out = y + blockIdx.x * cols;
  Welford w;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) w.add(to_float(row[c]));
  float mean, var;
  block_mean_var<kThreads>(w, &mean, &var);
  const float inv_std = rsqrtf(var + epsilon);
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    float v = (to_float(row[c]) - mean) * inv_std * to_float(scale[c]) + to_float(bias[c]);
    out[c] = from_float<T>(apply_act(act, v));
  }
}

template <typename T, int kVecs>
cudaError_t launch_vec(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t rows, int64_t cols, float epsilon,
                       bool tanh_approx) {
  const int col_vectors = static_cast<int>(cols / Vec<T>::kSize);
  const int threads = ((col_vectors + kVecs - 1) / kVecs + 31) / 32 * 32;
  for (int64_t r0 = 0; r0 < rows; r0 += 0x7fffffff) {  // grid.x limit
    const int64_t n = rows - r0 < 0x7fffffff ? rows - r0 : 0x7fffffff;
    auto args = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(n), threads, 0, stream>>>(reinterpret_cast<const Vec<T>*>(x + r0 * cols), reinterpret_cast<const Vec<T>*>(scale),
                                                                reinterpret_cast<const Vec<T>*>(bias), reinterpret_cast<Vec<T>*>(y + r0 * cols),
                                                                col_vectors, 1.f / static_cast<float>(cols), epsilon);
    };
    if (tanh_approx) {
      args(layer_norm_gelu_vec_kernel<T, kVecs, Act::kGeluTanh>);
    } else {
      args(layer_norm_gelu_vec_kernel<T, kVecs, Act::kGelu>);
    }
    DF_RETURN_IF_ERROR(cudaGetLastError());
  }
  return cudaSuccess;
}

}  // namespace

template <typename T>
cudaError_t launch_layer_norm_gelu(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y,
                                   int64_t rows, int64_t cols, float epsilon, bool tanh_approx) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int K = Vec<T>::kSize;
  if (cols % K == 0 && aligned16(x) && aligned16(y) && aligned16(scale) && aligned16(bias)) {
    // Short rows: at most kRowThreads threads with up to 8 vectors each (more rows in flight,
    // cheaper reductions); long rows: up to kMaxVecThreads threads with 8 vectors each.
    const int64_t col_vectors = cols / K;
    if (col_vectors <= kRowThreads) return launch_vec<T, 1>(stream, x, scale, bias, y, rows, cols, epsilon, tanh_approx);
    if (col_vectors <= 2 * kRowThreads) return launch_vec<T, 2>(stream, x, scale, bias, y, rows, cols, epsilon, tanh_approx);
    if (col_vectors <= 4 * kRowThreads) return launch_vec<T, 4>(stream, x, scale, bias, y, rows, cols, epsilon, tanh_approx);
    if (col_vectors <= 8 * kMaxVecThreads) return launch_vec<T, 8>(stream, x, scale, bias, y, rows, cols, epsilon, tanh_approx);
  }
  const Act act = tanh_approx ? Act::kGeluTanh : Act::kGelu;
  for (int64_t r0 = 0; r0 < rows; r0 += 0x7fffffff) {  // grid.x limit
    const int64_t n = rows - r0 < 0x7fffffff ? rows - r0 : 0x7fffffff;
    layer_norm_gelu_kernel<T><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x + r0 * cols, scale, bias, y + r0 * cols,
                                                                               cols, epsilon, act);
    DF_RETURN_IF_ERROR(cudaGetLastError());
  }
  return cudaSuccess;
}

template cudaError_t launch_layer_norm_gelu<float>(cudaStream_t, const float*, const float*, const float*, float*, int64_t, int64_t, float, bool);
template cudaError_t launch_layer_norm_gelu<__half>(cudaStream_t, const __half*, const __half*, const __half*, __half*, int64_t, int64_t, float, bool);
template cudaError_t launch_layer_norm_gelu<__nv_bfloat16>(cudaStream_t, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t, int64_t, float, bool);

}  // namespace deployfuse
