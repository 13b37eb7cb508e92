// FusedMHA dispatch and its CUDA-core kernel. fp16/bf16 calls try the Hopper path
// (fused_mha_sm90.cu: 9.0 GPUs, head_dim 64/128, positive scale), then the tensor-core path (fused_mha_tc.cu:
// sm_80+, head_dim 32/64/96/128, aligned tensors); fp32 and what both decline run the kernel here.
// Flash-style attention: a block owns 16 queries of one (batch, head); it streams K and V through
// shared memory 32 keys at a time. In each tile lane j scores key j for a query, the warp updates
// that query's running max m, denominator l and accumulator (online softmax:
// acc = acc * e^(m_old - m_new) + sum_j e^(s_j - m_new) v_j), so the score matrix never reaches
// global memory. Each lane owns head_dim / 32 output columns.
#include "fused_mha/fused_mha.cuh"
#include "fused_mha/fused_mha_sm90.cuh"
#include "fused_mha/fused_mha_tc.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/dtype.cuh"
#include "fused_mha/yq.cuh"

namespace deployfuse {
namespace {

constexpr int kWarps = 4;
constexpr int kQueriesPerWarp = 4;
constexpr int kQueries = kWarps * kQueriesPerWarp;
constexpr int kKeys = 32;

template <typename T, int kDimsPerLane>
__global__ void __launch_bounds__(kWarps * 32) fused_mha_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                                const T* __restrict__ v, const T* __restrict__ mask,
                                                                T* __restrict__ y, MhaShape s, MhaYq yq) {
  extern __shared__ float smem[];
  const int d = static_cast<int>(s.head_dim);
  float* s_q = smem;                       // [kQueries][d], pre-scaled
  float* s_k = s_q + kQueries * d;         // [kKeys][d + 1] (padded: conflict-free column reads)
  float* s_v = s_k + kKeys * (d + 1);      // [kKeys][d]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.y, b = bh / s.heads, h = bh % s.heads;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kQueries;
  const T* q_base = q + b * s.q_seq * s.q_ld + h * s.head_dim;
  const T* k_base = k + b * s.k_seq * s.k_ld + h * s.head_dim;
  const T* v_base = v + b * s.k_seq * s.v_ld + h * s.head_dim;

  for (int i = threadIdx.x; i < kQueries * d; i += blockDim.x) {
    const int64_t qi = q0 + i / d;
    s_q[i] = qi < s.q_seq ? to_float(q_base[qi * s.q_ld + i % d]) * s.scale : 0.f;
  }
  float m[kQueriesPerWarp], l[kQueriesPerWarp], acc[kQueriesPerWarp][kDimsPerLane];
#pragma unroll
  for (int t = 0; t < kQueriesPerWarp; ++t) {
    m[t] = -INFINITY;
    l[t] = 0.f;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) acc[t][c] = 0.f;
  }
  int64_t k_end = s.k_seq;
  if (s.causal) k_end = min(k_end, q0 + kQueries);  // later keys are masked for every query here

  for (int64_t k0 = 0; k0 < k_end; k0 += kKeys) {
    __syncthreads();
    for (int i = threadIdx.x; i < kKeys * d; i += blockDim.x) {
      const int j = i / d, c = i % d;
      const bool in = k0 + j < s.k_seq;
      s_k[j * (d + 1) + c] = in ? to_float(k_base[(k0 + j) * s.k_ld + c]) : 0.f;
      s_v[j * d + c] = in ? to_float(v_base[(k0 + j) * s.v_ld + c]) : 0.f;
    }
    __syncthreads();
    const int64_t key = k0 + lane;
#pragma unroll
    for (int t = 0; t < kQueriesPerWarp; ++t) {
      const int local = warp * kQueriesPerWarp + t;
      const int64_t qi = q0 + local;
      if (qi >= s.q_seq) break;  // warp-uniform
      float score = -INFINITY;
      if (key < s.k_seq && !(s.causal && key > qi)) {
        const float* qr = s_q + local * d;
        const float* kr = s_k + lane * (d + 1);
        float dot = 0.f;
        for (int c = 0; c < d; ++c) dot = fmaf(qr[c], kr[c], dot);
        score = dot;
        if (mask) score += to_float(mask[b * s.mask_stride[0] + h * s.mask_stride[1] + qi * s.mask_stride[2] + key * s.mask_stride[3]]);
      }
      float tile_max = score;
      for (int off = 16; off > 0; off >>= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      const float m_new = fmaxf(m[t], tile_max);
      if (m_new == -INFINITY) continue;  // everything so far masked
      const float p = __expf(score - m_new);
      const float alpha = __expf(m[t] - m_new);
      float p_sum = p;
      for (int off = 16; off > 0; off >>= 1) p_sum += __shfl_xor_sync(0xffffffffu, p_sum, off);
      l[t] = l[t] * alpha + p_sum;
      m[t] = m_new;
#pragma unroll
      for (int c = 0; c < kDimsPerLane; ++c) acc[t][c] *= alpha;
      for (int j = 0; j < kKeys; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const float* vr = s_v + j * d;
#pragma unroll
        for (int c = 0; c < kDimsPerLane; ++c) {
          const int col = lane + 32 * c;
          if (col < d) acc[t][c] = fmaf(pj, vr[col], acc[t][c]);
        }
      }
    }
  }
  const E4m3Divisor yq_scale(yq.yq ? *yq.scale : 1.f);
#pragma unroll
  for (int t = 0; t < kQueriesPerWarp; ++t) {
    const int64_t qi = q0 + warp * kQueriesPerWarp + t;
    if (qi >= s.q_seq) break;
    const float inv = l[t] > 0.f ? 1.f / l[t] : 0.f;
    const int64_t at = (b * s.q_seq + qi) * s.heads * s.head_dim + h * s.head_dim;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int col = lane + 32 * c;
      if (col >= d) continue;
      const T out = from_float<T>(acc[t][c] * inv);
      if (y) y[at + col] = out;
      if (yq.yq) yq.yq[at + col] = e4m3_of(out, yq_scale);
    }
  }
}

template <typename T, int kDimsPerLane>
cudaError_t launch_with(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& s, MhaYq yq) {
  const int d = static_cast<int>(s.head_dim);
  const size_t smem = sizeof(float) * (kQueries * d + kKeys * (d + 1) + kKeys * d);
  if (smem > 48 * 1024) {
    DF_RETURN_IF_ERROR(cudaFuncSetAttribute(fused_mha_kernel<T, kDimsPerLane>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  const dim3 grid(static_cast<unsigned>((s.q_seq + kQueries - 1) / kQueries), static_cast<unsigned>(s.batch * s.heads));
  fused_mha_kernel<T, kDimsPerLane><<<grid, kWarps * 32, smem, stream>>>(q, k, v, mask, y, s, yq);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t launch_fused_mha(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& s, MhaYq yq) {
  if (s.batch == 0 || s.q_seq == 0 || s.heads == 0) return cudaSuccess;
  if (s.head_dim <= 0 || s.head_dim > 256 || s.batch * s.heads > 65535) return cudaErrorInvalidValue;
  if constexpr (!std::is_same_v<T, float>) {
    cudaError_t err = cudaErrorNotSupported;
#ifdef DEPLOYFUSE_WITH_SM90A
    err = launch_fused_mha_sm90(stream, q, k, v, mask, y, s, yq);
    if (err != cudaErrorNotSupported) return err;
#endif
    err = launch_fused_mha_tc(stream, q, k, v, mask, y, s, yq);
    if (err != cudaErrorNotSupported) return err;
  }
  if (s.head_dim <= 32) return launch_with<T, 1>(stream, q, k, v, mask, y, s, yq);
  if (s.head_dim <= 64) return launch_with<T, 2>(stream, q, k, v, mask, y, s, yq);
  if (s.head_dim <= 128) return launch_with<T, 4>(stream, q, k, v, mask, y, s, yq);
  return launch_with<T, 8>(stream, q, k, v, mask, y, s, yq);
}

template cudaError_t launch_fused_mha<float>(cudaStream_t, const float*, const float*, const float*, const float*, float*, const MhaShape&, MhaYq);
template cudaError_t launch_fused_mha<__half>(cudaStream_t, const __half*, const __half*, const __half*, const __half*, __half*, const MhaShape&,
                                              MhaYq);
template cudaError_t launch_fused_mha<__nv_bfloat16>(cudaStream_t, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                                     __nv_bfloat16*, const MhaShape&, MhaYq);

}  // namespace deployfuse
