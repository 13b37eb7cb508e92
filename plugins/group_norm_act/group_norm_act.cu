// Two paths. On Hopper (sm_90+), when spatial is a whole number of 16-byte vectors and X, Y are
// 16-byte aligned: each (sample, group) is split over a cluster of kCluster blocks; a block holds
// its slice of the group in registers, the partial sums meet through distributed shared memory
// (mean first, then the sum of squared deviations from it: exact two-pass statistics), and the
// block normalises + activates its slice from registers. X is read once, Y written once.
// Otherwise: one block per (sample, group), Welford statistics, then a second sweep.
#include "group_norm_act/group_norm_act.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/cuda_check.h"
#include "common/dtype.cuh"

namespace deployfuse {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kClusterThreads = 256;
constexpr int kCluster = 8;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The sum of every block's `part` over the cluster (each block passes its block-wide total).
__device__ __forceinline__ float cluster_sum(float part, float* slot) {
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) *slot = part;
  cluster.sync();
  float total = 0.f;
#pragma unroll
  for (int r = 0; r < kCluster; ++r) total += *cluster.map_shared_rank(slot, r);
  return total;
}
#endif

template <typename T, int kVecs, Act kAct>
__global__ void __launch_bounds__(kClusterThreads) group_norm_act_cluster_kernel(const Vec<T>* __restrict__ x, const T* __restrict__ scale,
                                                                                 const T* __restrict__ bias, Vec<T>* __restrict__ y,
                                                                                 int64_t span_vectors, int64_t spatial, int64_t group_channels,
                                                                                 int64_t groups, float inv_span, float epsilon) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int K = Vec<T>::kSize;
  __shared__ float s_parts[2];
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t group = blockIdx.x / kCluster;
  const int64_t chunk = (span_vectors + kCluster - 1) / kCluster;
  const int64_t begin = cluster.block_rank() * chunk;
  const int64_t end = begin + chunk < span_vectors ? begin + chunk : span_vectors;
  const Vec<T>* xg = x + group * span_vectors;
  Vec<T>* yg = y + group * span_vectors;
  Vec<T> v[kVecs];  // the slice stays in its storage type: half the registers for 16-bit data
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t i = begin + threadIdx.x + j * kClusterThreads;
    if (i < end) v[j] = xg[i];
  }
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (begin + threadIdx.x + j * kClusterThreads < end) {
#pragma unroll
      for (int k = 0; k < K; ++k) sum += to_float(v[j].v[k]);
    }
  }
  const float mean = cluster_sum(block_sum(sum), &s_parts[0]) * inv_span;
  float sq = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (begin + threadIdx.x + j * kClusterThreads < end) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float d = to_float(v[j].v[k]) - mean;
        sq = fmaf(d, d, sq);
      }
    }
  }
  const float inv_std = rsqrtf(cluster_sum(block_sum(sq), &s_parts[1]) * inv_span + epsilon);
  cluster.sync();  // no block leaves while another still reads its s_parts
  const int64_t first_channel = (group % groups) * group_channels;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t i = begin + threadIdx.x + j * kClusterThreads;
    if (i < end) {
      const int64_t ch = first_channel + (i * K) / spatial;  // a vector never straddles two channels
      const float a = to_float(scale[ch]) * inv_std;
      const float b = to_float(bias[ch]) - mean * a;
      Vec<T> o;
#pragma unroll
      for (int k = 0; k < K; ++k) o.v[k] = from_float<T>(act_fast<kAct>(fmaf(to_float(v[j].v[k]), a, b)));
      yg[i] = o;
    }
  }
#endif
}

template <typename T>
__global__ void __launch_bounds__(kThreads) group_norm_act_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                                                                  const T* __restrict__ bias, T* __restrict__ y,
                                                                  int64_t group_channels, int64_t spatial, int64_t groups,
                                                                  float epsilon, Act act) {
  const int64_t span = group_channels * spatial;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * span;
  const int64_t first_channel = (blockIdx.x % groups) * group_channels;
  Welford w;
  for (int64_t i = threadIdx.x; i < span; i += kThreads) w.add(to_float(x[base + i]));
  float mean, var;
  block_mean_var<kThreads>(w, &mean, &var);
  const float inv_std = rsqrtf(var + epsilon);
  for (int64_t c = 0; c < group_channels; ++c) {
    const float a = to_float(scale[first_channel + c]) * inv_std;
    const float b = to_float(bias[first_channel + c]) - mean * a;
    const int64_t off = base + c * spatial;
    for (int64_t s = threadIdx.x; s < spatial; s += kThreads) y[off + s] = from_float<T>(apply_act(act, to_float(x[off + s]) * a + b));
  }
}

bool has_clusters() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 9;
}

template <typename T, int kVecs>
cudaError_t launch_cluster(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t n, int64_t channels,
                           int64_t spatial, int64_t groups, float epsilon, Act act) {
  const int64_t group_channels = channels / groups, span = group_channels * spatial;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(n * groups * kCluster));
  config.blockDim = dim3(kClusterThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = kCluster;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  auto go = [&](auto a) {
    return cudaLaunchKernelEx(&config, group_norm_act_cluster_kernel<T, kVecs, decltype(a)::value>, reinterpret_cast<const Vec<T>*>(x), scale,
                              bias, reinterpret_cast<Vec<T>*>(y), span / Vec<T>::kSize, spatial, group_channels, groups,
                              1.f / static_cast<float>(span), epsilon);
  };
  switch (act) {  // the activations GroupNormAct accepts
    case Act::kSilu: return go(std::integral_constant<Act, Act::kSilu>());
    case Act::kGelu: return go(std::integral_constant<Act, Act::kGelu>());
    default: return go(std::integral_constant<Act, Act::kNone>());
  }
}

}  // namespace

template <typename T>
cudaError_t launch_group_norm_act(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t n,
                                  int64_t channels, int64_t spatial, int64_t groups, float epsilon, Act act) {
  if (n == 0 || channels == 0 || spatial == 0) return cudaSuccess;
  if (groups <= 0 || channels % groups != 0) return cudaErrorInvalidValue;
  if (act != Act::kSilu && act != Act::kGelu && act != Act::kNone) return cudaErrorInvalidValue;
  constexpr int K = Vec<T>::kSize;
  const int64_t span_vectors = channels / groups * spatial / K;
  const int64_t chunk = (span_vectors + kCluster - 1) / kCluster;
  if (spatial % K == 0 && aligned16(x) && aligned16(y) && n * groups * kCluster < 0x7fffffff && has_clusters()) {
    if (chunk <= kClusterThreads) return launch_cluster<T, 1>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, act);
    if (chunk <= 2 * kClusterThreads) return launch_cluster<T, 2>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, act);
    if (chunk <= 4 * kClusterThreads) return launch_cluster<T, 4>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, act);
    if (chunk <= 8 * kClusterThreads) return launch_cluster<T, 8>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, act);
  }
  group_norm_act_kernel<T><<<static_cast<unsigned>(n * groups), kThreads, 0, stream>>>(x, scale, bias, y, channels / groups, spatial,
                                                                                       groups, epsilon, act);
  return cudaGetLastError();
}

template cudaError_t launch_group_norm_act<float>(cudaStream_t, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, float, Act);
template cudaError_t launch_group_norm_act<__half>(cudaStream_t, const __half*, const __half*, const __half*, __half*, int64_t, int64_t, int64_t, int64_t, float, Act);
template cudaError_t launch_group_norm_act<__nv_bfloat16>(cudaStream_t, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t, int64_t, int64_t, int64_t, float, Act);

}  // namespace deployfuse
