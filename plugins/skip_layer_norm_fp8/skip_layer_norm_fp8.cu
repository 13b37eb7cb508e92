// SkipLayerNormFp8's kernels. Rows of whole 16-byte vectors (cols % (16 / sizeof(T)) == 0, every pointer 16-byte aligned) keep the
// row's float32 sum in registers and read X (and Skip) once:
// - up to kOneVecThreads vectors (8192 fp16/bf16, 4096 fp32 columns): a block per row and ONE vector a thread (threads = the
//   row's vectors rounded up to 32: BERT's 768 fp16 -> 96, 1024 -> 128), so that the short-row, few-row launches (1024 rows: 8
//   rows an SM) have many warps in flight, each with one independent load per input, as ORT's SkipLayerNormalization is shaped.
//   It replaced a warp-per-row kernel: 0.77-0.88 of its kernel time at BERT's, GPT-2's, ViT-B/16's and BERT-large's rows (H200,
//   bench/results/sln_paths_h200.log);
// - longer rows, up to kMaxThreads * kBlockVecs vectors: a block per row, kBlockVecs vectors a thread.
// The block kernels reduce by warp shuffles, then one barrier and each thread adding the warps' totals from shared memory, each
// statistic in its own slots (the second reduction's writes cannot meet the first's reads: one barrier a statistic); the
// one-vector kernel loads Gamma, Beta and YScale before the statistics, so that their latency hides behind the barriers.
// Both: the sum, then the mean, then the sum of squared deviations from it (exact two-pass statistics from registers), then per
// element y = fma(fma(s, rstd, -mean rstd), gamma, beta) rounded to T, and the float8 copy from that rounded y: y / y_scale
// (correctly rounded, as the CPU kernel and the function body's Div: a multiply for a power-of-two YScale, E4m3Divisor) -> e4m3 with
// saturation, two elements a conversion, one 8-byte (16-bit T) or 4-byte (fp32) store a vector. Any other row: a block per row that
// recomputes the sum in each of its three sweeps (from L1/L2). With ids (GPT-2's embeddings, looked up by the norm) a block reads its row's
// id, then that table row; a broadcast skip's row is r % skip_rows (the division skipped where skip has every row).
#include <cuda_fp8.h>

#include "common/cuda_check.h"
#include "common/dtype.cuh"
#include "common/e4m3_divisor.cuh"
#include "common/vec_math.cuh"
#include "skip_layer_norm_fp8/skip_layer_norm_fp8.cuh"

namespace deployfuse {
namespace {

constexpr int kOneVecThreads = 1024;  // the one-vector kernel: at most a vector a thread
constexpr int kBlockVecs = 8;         // vectors a thread of the longer rows' block kernel
constexpr int kMaxThreads = 512;      // its threads
constexpr int kFallbackThreads = 256;

// The pointers and sizes of a launch: one argument for every kernel. A part of a launch (rows_from) keeps the pointers and starts at
// row first: block b works on row first + b.
template <typename T>
struct Rows {
  const T *x, *skip, *gamma, *beta, *bias;
  const float* y_scale;
  T* y;
  uint8_t* yq;
  T* sum;
  int64_t rows, cols;
  float epsilon;
  const int64_t* ids;  // null: row r reads x's row r; else x's row table_row(ids[r], table_rows)
  int64_t table_rows, skip_rows;
  int64_t first;

  __device__ __forceinline__ int64_t x_row(int64_t r) const { return ids ? table_row(ids[r], table_rows) : r; }
  __device__ __forceinline__ int64_t skip_row(int64_t r) const { return r < skip_rows ? r : r % skip_rows; }
};

// The float8 bytes of elements 2k, 2k+1 of a vector.
__device__ __forceinline__ __nv_fp8x2_storage_t e4m3_pair(float a, float b, const E4m3Divisor& scale) {
  return __nv_cvt_float2_to_fp8x2(scale.divide(a, b), __NV_SATFINITE, __NV_E4M3);
}

// This thread's vectors of one row, c = first + j * step (j < kVecs, c < n), summed in float32. kEarly: Gamma, Beta and YScale
// loaded by prefetch() before the statistics, whose barriers would otherwise leave their latency exposed (the one-vector path).
template <typename T, int kVecs, bool kEarly = false, bool kMapped = false>
struct RowSum {
  static constexpr int kSize = Vec<T>::kSize;
  float v[kVecs][kSize];
  Vec<T> g[kEarly ? kVecs : 1], b[kEarly ? kVecs : 1];
  float y_scale = 1.f;

  __device__ __forceinline__ void prefetch(const Rows<T>& a, int first, int step, int n) {
    static_assert(kEarly, "prefetch() fills the kEarly members");
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int c = first + j * step;
      if (c < n) {
        g[j] = reinterpret_cast<const Vec<T>*>(a.gamma)[c];
        b[j] = reinterpret_cast<const Vec<T>*>(a.beta)[c];
      }
    }
    if (a.yq) y_scale = __ldg(a.y_scale);
  }

  // s = x [+ skip] + bias (x's and skip's rows as a maps row); returns this thread's share of the row total.
  __device__ __forceinline__ float load(const Rows<T>& a, int64_t row, int first, int step, int n) {
    const auto* x = reinterpret_cast<const Vec<T>*>(a.x) + (kMapped ? a.x_row(row) : row) * n;
    const auto* skip = a.skip ? reinterpret_cast<const Vec<T>*>(a.skip) + (kMapped ? a.skip_row(row) : row) * n : nullptr;
    const auto* bias = reinterpret_cast<const Vec<T>*>(a.bias);
    float total = 0.f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int c = first + j * step;
      if (c < n) {
        const Vec<T> xv = x[c], bv = bias[c];
        Vec<T> sv{};
        if (skip) sv = skip[c];
#pragma unroll
        for (int k = 0; k < kSize; k += 2) {
          const float2 f = pair_to_float2(xv, k / 2), b = pair_to_float2(bv, k / 2);
          float2 s = make_float2(0.f, 0.f);
          if (skip) s = pair_to_float2(sv, k / 2);
          v[j][k] = f.x + b.x + s.x;
          v[j][k + 1] = f.y + b.y + s.y;
          total += v[j][k] + v[j][k + 1];
        }
      }
    }
    return total;
  }

  __device__ __forceinline__ float squared_deviations(float mean, int first, int step, int n) const {
    float total = 0.f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (first + j * step < n) {
#pragma unroll
        for (int k = 0; k < kSize; ++k) {
          const float d = v[j][k] - mean;
          total = fmaf(d, d, total);
        }
      }
    }
    return total;
  }

  __device__ __forceinline__ void store(const Rows<T>& a, int64_t row, float mean, float rstd, int first, int step, int n) const {
    const float shift = -mean * rstd;
    const E4m3Divisor scale(kEarly ? y_scale : a.yq ? __ldg(a.y_scale) : 1.f);
    const auto* gamma = reinterpret_cast<const Vec<T>*>(a.gamma);
    const auto* beta = reinterpret_cast<const Vec<T>*>(a.beta);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int c = first + j * step;
      if (c >= n) continue;
      const Vec<T> gv = kEarly ? g[j] : gamma[c], bv = kEarly ? b[j] : beta[c];
      Vec<T> out, total;
      alignas(8) __nv_fp8x2_storage_t q[kSize / 2];
#pragma unroll
      for (int k = 0; k < kSize; k += 2) {
        const float2 g = pair_to_float2(gv, k / 2), b = pair_to_float2(bv, k / 2);
        set_pair(out, k / 2, fmaf(fmaf(v[j][k], rstd, shift), g.x, b.x), fmaf(fmaf(v[j][k + 1], rstd, shift), g.y, b.y));
        const float2 rounded = pair_to_float2(out, k / 2);  // YQ from Y as rounded to T
        q[k / 2] = e4m3_pair(rounded.x, rounded.y, scale);
        set_pair(total, k / 2, v[j][k], v[j][k + 1]);
      }
      const int64_t at = row * n + c;
      if (a.y) reinterpret_cast<Vec<T>*>(a.y)[at] = out;
      if (a.sum) reinterpret_cast<Vec<T>*>(a.sum)[at] = total;
      if (a.yq) {
        if constexpr (kSize == 8) {
          reinterpret_cast<uint2*>(a.yq)[at] = *reinterpret_cast<const uint2*>(q);
        } else {
          reinterpret_cast<uint32_t*>(a.yq)[at] = *reinterpret_cast<const uint32_t*>(q);
        }
      }
    }
  }
};

// The block's total of v (blockDim.x a multiple of 32); every thread gets it, the same bits. kSlot: the statistic's own slots of
// partial, so that two reductions need no barrier between them.
template <int kSlot>
__device__ __forceinline__ float row_total(float v, float (&partial)[2][32]) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) partial[kSlot][threadIdx.x >> 5] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x >> 5);
  float total = partial[kSlot][0];
  for (int w = 1; w < warps; ++w) total += partial[kSlot][w];
  return total;
}

// A block per row (n <= blockDim.x * kVecs vectors), kVecs vectors a thread. kMapped: X's rows looked up by ids or Skip broadcast
// (Rows::x_row, skip_row); without, row r reads row r of each (with that index math in every row the plain rows took 17.06 us
// at 8192 x 768 on the H200, 16.36 in their own instance: bench/results/sln_stats_h200.log).
template <typename T, int kVecs, bool kMapped>
__global__ void __launch_bounds__(kVecs == 1 ? kOneVecThreads : kMaxThreads) block_kernel(Rows<T> a, int n, float inv_cols) {
  __shared__ float partial[2][32];
  const int64_t r = a.first + blockIdx.x;
  RowSum<T, kVecs, kVecs == 1, kMapped> s;
  if constexpr (kVecs == 1) s.prefetch(a, threadIdx.x, blockDim.x, n);
  const float mean = row_total<0>(s.load(a, r, threadIdx.x, blockDim.x, n), partial) * inv_cols;
  const float rstd = rsqrtf(row_total<1>(s.squared_deviations(mean, threadIdx.x, blockDim.x, n), partial) * inv_cols + a.epsilon);
  s.store(a, r, mean, rstd, threadIdx.x, blockDim.x, n);
}

// Any row: element by element, the sum recomputed in each sweep.
template <typename T>
__global__ void __launch_bounds__(kFallbackThreads) row_kernel(Rows<T> a, float inv_cols) {
  const int64_t r = a.first + blockIdx.x, at = r * a.cols, x_at = a.x_row(r) * a.cols;
  const int64_t skip_at = a.skip ? a.skip_row(r) * a.cols : 0;
  const auto total = [&](int64_t c) {
    return to_float(a.x[x_at + c]) + to_float(a.bias[c]) + (a.skip ? to_float(a.skip[skip_at + c]) : 0.f);
  };
  float part = 0.f;
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) part += total(c);
  const float mean = block_sum(part) * inv_cols;
  part = 0.f;
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
    const float d = total(c) - mean;
    part = fmaf(d, d, part);
  }
  const float rstd = rsqrtf(block_sum(part) * inv_cols + a.epsilon);
  const E4m3Divisor scale(a.yq ? __ldg(a.y_scale) : 1.f);
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
    const float s = total(c);
    const T y = from_float<T>(fmaf((s - mean) * rstd, to_float(a.gamma[c]), to_float(a.beta[c])));
    if (a.y) a.y[at + c] = y;
    if (a.sum) a.sum[at + c] = from_float<T>(s);
    if (a.yq) a.yq[at + c] = __nv_cvt_float_to_fp8(scale.divide(to_float(y)), __NV_SATFINITE, __NV_E4M3);
  }
}

template <typename T>
bool vectorisable(const Rows<T>& a) {
  const auto ok = [](const void* p) { return p == nullptr || aligned16(p); };
  // YQ's rows: 8 bytes a vector of 16-bit T, 4 of fp32 (its base as ORT allocates it, 256-byte aligned)
  return a.cols % Vec<T>::kSize == 0 && ok(a.x) && ok(a.skip) && ok(a.gamma) && ok(a.beta) && ok(a.bias) && ok(a.y) && ok(a.sum) &&
         ok(a.yq);
}

// Rows r0 .. r0 + count of a: the part of a launch within the grid's limits.
template <typename T>
Rows<T> rows_from(const Rows<T>& a, int64_t r0, int64_t count) {
  Rows<T> part = a;
  part.first = r0;
  part.rows = count;
  return part;
}

// launch(part, blocks): a block per row of part, a's rows in parts within the grid's x limit.
template <typename T, typename Launch>
cudaError_t launch_by_rows(const Rows<T>& a, Launch launch) {
  constexpr int64_t kMaxBlocks = 0x7fffffff;
  for (int64_t r0 = 0; r0 < a.rows; r0 += kMaxBlocks) {
    const int64_t count = a.rows - r0 < kMaxBlocks ? a.rows - r0 : kMaxBlocks;
    launch(rows_from(a, r0, count), static_cast<unsigned>(count));
    DF_RETURN_IF_ERROR(cudaGetLastError());
  }
  return cudaSuccess;
}

// kVecs vectors a thread: threads = n / kVecs rounded up to 32.
template <typename T, int kVecs>
cudaError_t launch_block(cudaStream_t stream, const Rows<T>& a, int n, float inv_cols) {
  const int threads = ((n + kVecs - 1) / kVecs + 31) / 32 * 32;
  const bool mapped = a.ids != nullptr || (a.skip != nullptr && a.skip_rows != a.rows);
  return launch_by_rows(a, [&](const Rows<T>& part, unsigned blocks) {
    if (mapped) {
      block_kernel<T, kVecs, true><<<blocks, threads, 0, stream>>>(part, n, inv_cols);
    } else {
      block_kernel<T, kVecs, false><<<blocks, threads, 0, stream>>>(part, n, inv_cols);
    }
  });
}

}  // namespace

template <typename T>
cudaError_t launch_skip_layer_norm_fp8(cudaStream_t stream, const T* x, const T* skip, const T* gamma, const T* beta, const T* bias,
                                       const float* y_scale, T* y, uint8_t* yq, T* sum, int64_t rows, int64_t cols, float epsilon,
                                       const int64_t* ids, int64_t table_rows, int64_t skip_rows) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const Rows<T> a{x, skip, gamma, beta, bias, y_scale, y, yq, sum, rows, cols, epsilon, ids, table_rows, skip_rows > 0 ? skip_rows : rows,
                  0};
  const float inv_cols = 1.f / static_cast<float>(cols);
  if (vectorisable(a)) {
    const int64_t n = cols / Vec<T>::kSize;
    if (n <= kOneVecThreads) return launch_block<T, 1>(stream, a, static_cast<int>(n), inv_cols);
    if (n <= int64_t{kMaxThreads} * kBlockVecs) return launch_block<T, kBlockVecs>(stream, a, static_cast<int>(n), inv_cols);
  }
  return launch_by_rows(
      a, [&](const Rows<T>& part, unsigned blocks) { row_kernel<T><<<blocks, kFallbackThreads, 0, stream>>>(part, inv_cols); });
}

#define DF_INSTANTIATE(T)                                                                                                              \
  template cudaError_t launch_skip_layer_norm_fp8<T>(cudaStream_t, const T*, const T*, const T*, const T*, const T*, const float*, T*, \
                                                     uint8_t*, T*, int64_t, int64_t, float, const int64_t*, int64_t, int64_t);
DF_INSTANTIATE(float)
DF_INSTANTIATE(__half)
DF_INSTANTIATE(__nv_bfloat16)
#undef DF_INSTANTIATE

}  // namespace deployfuse
