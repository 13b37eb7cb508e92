// Three paths.
// - Rows of whole 16-byte vectors (cols % (16 / sizeof(T)) == 0, all pointers 16-byte aligned):
//   * up to kWarpMaxVecs * 32 vectors (4096 fp16/bf16 or 2048 fp32 columns): a warp per row,
//     kRowsPerBlock rows a block, each lane holding up to kWarpMaxVecs vectors of the row in
//     registers (storage type). Statistics by warp shuffles only: no __syncthreads, no shared
//     memory, warps of a block independent of each other.
//   * longer rows, up to kMaxVecThreads * 8 vectors: a block per row, 8 vectors a thread, block
//     reductions through shared memory.
//   Both read X once: mean, then the sum of squared deviations from it (exact two-pass
//   statistics, both from registers), then y = gelu(fma(fma(x, rstd, -mean rstd), scale, bias))
//   in fp32 with the lean activations of common/vec_math.cuh and packed 16-byte stores.
//   (16-bit rows were bound by instructions an element, not bytes: ~42 SASS instructions an
//   element in round 3, ~24 now, i.e. about 0.05 ms of issue time at 16384x4096 against 0.063 ms
//   of copy time for the 268 MB moved.)
// - Otherwise: Welford statistics over the row, then a second sweep (from L1/L2).
#include "layer_norm_gelu/layer_norm_gelu.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/activation.h"
#include "common/cuda_check.h"
#include "common/dtype.cuh"
#include "common/vec_math.cuh"

namespace deployfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVecThreads = 512;
constexpr int kBlockVecs = 8;      // vectors a thread on the block-per-row path
constexpr int kRowsPerBlock = 4;   // warp-per-row path: 128-thread blocks
constexpr int kWarpMaxVecs = 16;   // vectors a lane: rows up to 512 vectors (8 KB of 16-bit data)

// This thread's vectors of a row, c = first + j * step (j < kVecs, c < n), in the storage type:
// half the registers for 16-bit data. (The bounds checks also keep ptxas from hoisting every
// scale/bias load to the top: a variant without them for rows that fill every slice spilled.)
template <typename T, int kVecs>
struct RowSlice {
  static constexpr int kPairs = Vec<T>::kSize / 2;
  Vec<T> v[kVecs];
  static __device__ __forceinline__ bool ok(int c, int n) { return c < n; }

  __device__ __forceinline__ void load(const Vec<T>* __restrict__ row, int first, int step, int n) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (ok(first + j * step, n)) v[j] = row[first + j * step];
    }
  }
  __device__ __forceinline__ float sum(int first, int step, int n) const {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (ok(first + j * step, n)) {
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          const float2 f = pair_to_float2(v[j], k);
          s += f.x + f.y;
        }
      }
    }
    return s;
  }
  __device__ __forceinline__ void opaque_all() {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) opaque(v[j]);
  }
  __device__ __forceinline__ float squared_deviations(float mean, int first, int step, int n) const {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (ok(first + j * step, n)) {
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          const float2 f = pair_to_float2(v[j], k);
          const float d0 = f.x - mean, d1 = f.y - mean;
          s = fmaf(d0, d0, s);
          s = fmaf(d1, d1, s);
        }
      }
    }
    return s;
  }
  // out[c] = act((x - mean) * rstd * scale[c] + bias[c]), the normalisation as one fma.
  template <Act kAct>
  __device__ __forceinline__ void store(Vec<T>* __restrict__ out, const Vec<T>* __restrict__ scale, const Vec<T>* __restrict__ bias,
                                        float mean, float rstd, int first, int step, int n) const {
    const float shift = -mean * rstd;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int c = first + j * step;
      if (ok(c, n)) {
        const Vec<T> sv = scale[c], bv = bias[c];
        Vec<T> o;
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          const float2 f = pair_to_float2(v[j], k), g = pair_to_float2(sv, k), b = pair_to_float2(bv, k);
          set_pair(o, k, act_lean<kAct>(fmaf(fmaf(f.x, rstd, shift), g.x, b.x)), act_lean<kAct>(fmaf(fmaf(f.y, rstd, shift), g.y, b.y)));
        }
        out[c] = o;
      }
    }
  }
};

// A warp per row (col_vectors <= 32 * kVecs), kRowsPerBlock rows a block. The 16-vector slices
// are held to 96 registers (5 blocks = 20 rows an SM; 105 unbounded; no spills either way).
template <typename T, int kVecs, Act kAct>
__global__ void __launch_bounds__(kRowsPerBlock * 32, kVecs >= 16 ? 5 : 1)
    layer_norm_gelu_warp_kernel(const Vec<T>* __restrict__ x, const Vec<T>* __restrict__ scale, const Vec<T>* __restrict__ bias,
                                Vec<T>* __restrict__ y, int64_t rows, int col_vectors, float inv_cols, float epsilon) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;  // the whole warp: only warp shuffles follow, no block barrier
  const int lane = threadIdx.x & 31;
  RowSlice<T, kVecs> s;
  s.load(x + r * col_vectors, lane, 32, col_vectors);
  const float mean = warp_sum(s.sum(lane, 32, col_vectors)) * inv_cols;
  s.opaque_all();
  const float rstd = rsqrtf(warp_sum(s.squared_deviations(mean, lane, 32, col_vectors)) * inv_cols + epsilon);
  s.opaque_all();
  s.template store<kAct>(y + r * col_vectors, scale, bias, mean, rstd, lane, 32, col_vectors);
}

// A block per row (col_vectors <= blockDim.x * kBlockVecs).
template <typename T, Act kAct>
__global__ void __launch_bounds__(kMaxVecThreads) layer_norm_gelu_vec_kernel(const Vec<T>* __restrict__ x, const Vec<T>* __restrict__ scale,
                                                                             const Vec<T>* __restrict__ bias, Vec<T>* __restrict__ y,
                                                                             int col_vectors, float inv_cols, float epsilon) {
  const int64_t r = blockIdx.x;
  const int t = threadIdx.x, step = blockDim.x;
  RowSlice<T, kBlockVecs> s;
  s.load(x + r * col_vectors, t, step, col_vectors);
  const float mean = block_sum(s.sum(t, step, col_vectors)) * inv_cols;
  s.opaque_all();
  const float rstd = rsqrtf(block_sum(s.squared_deviations(mean, t, step, col_vectors)) * inv_cols + epsilon);
  s.opaque_all();
  s.template store<kAct>(y + r * col_vectors, scale, bias, mean, rstd, t, step, col_vectors);
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
cudaError_t launch_warp(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t rows, int64_t cols, float epsilon,
                        bool tanh_approx) {
  const int col_vectors = static_cast<int>(cols / Vec<T>::kSize);
  constexpr int64_t kMaxRows = int64_t{0x7fffffff} * kRowsPerBlock;  // grid.x limit
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int64_t n = rows - r0 < kMaxRows ? rows - r0 : kMaxRows;
    const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
    auto args = [&](auto kernel) {
      kernel<<<blocks, kRowsPerBlock * 32, 0, stream>>>(reinterpret_cast<const Vec<T>*>(x + r0 * cols), reinterpret_cast<const Vec<T>*>(scale),
                                                        reinterpret_cast<const Vec<T>*>(bias), reinterpret_cast<Vec<T>*>(y + r0 * cols), n,
                                                        col_vectors, 1.f / static_cast<float>(cols), epsilon);
    };
    if (tanh_approx) {
      args(layer_norm_gelu_warp_kernel<T, kVecs, Act::kGeluTanh>);
    } else {
      args(layer_norm_gelu_warp_kernel<T, kVecs, Act::kGelu>);
    }
    DF_RETURN_IF_ERROR(cudaGetLastError());
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t launch_block(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t rows, int64_t cols, float epsilon,
                         bool tanh_approx) {
  const int col_vectors = static_cast<int>(cols / Vec<T>::kSize);
  const int threads = ((col_vectors + kBlockVecs - 1) / kBlockVecs + 31) / 32 * 32;
  for (int64_t r0 = 0; r0 < rows; r0 += 0x7fffffff) {  // grid.x limit
    const int64_t n = rows - r0 < 0x7fffffff ? rows - r0 : 0x7fffffff;
    auto args = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(n), threads, 0, stream>>>(reinterpret_cast<const Vec<T>*>(x + r0 * cols), reinterpret_cast<const Vec<T>*>(scale),
                                                                reinterpret_cast<const Vec<T>*>(bias), reinterpret_cast<Vec<T>*>(y + r0 * cols),
                                                                col_vectors, 1.f / static_cast<float>(cols), epsilon);
    };
    if (tanh_approx) {
      args(layer_norm_gelu_vec_kernel<T, Act::kGeluTanh>);
    } else {
      args(layer_norm_gelu_vec_kernel<T, Act::kGelu>);
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
    // The smallest register slice that holds the row: a warp per row up to 32 * kWarpMaxVecs
    // vectors, then a block per row with kBlockVecs vectors a thread.
    const int64_t col_vectors = cols / K;
    if (col_vectors <= 32) return launch_warp<T, 1>(stream, x, scale, bias, y, rows, cols, epsilon, tanh_approx);
    if (col_vectors <= 64) return launch_warp<T, 2>(stream, x, scale, bias, y, rows, cols, epsilon, tanh_approx);
    if (col_vectors <= 128) return launch_warp<T, 4>(stream, x, scale, bias, y, rows, cols, epsilon, tanh_approx);
    if (col_vectors <= 256) return launch_warp<T, 8>(stream, x, scale, bias, y, rows, cols, epsilon, tanh_approx);
    if (col_vectors <= 32 * kWarpMaxVecs) return launch_warp<T, kWarpMaxVecs>(stream, x, scale, bias, y, rows, cols, epsilon, tanh_approx);
    if (col_vectors <= kBlockVecs * kMaxVecThreads) return launch_block<T>(stream, x, scale, bias, y, rows, cols, epsilon, tanh_approx);
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
