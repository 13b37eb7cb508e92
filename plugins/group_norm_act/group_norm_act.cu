// Two paths. On Hopper (sm_90+), when spatial is a whole number of 16-byte vectors, X and Y are
// 16-byte aligned and a (sample, group) slice is at most kCluster * 8 * kClusterThreads vectors:
// each slice is split over a cluster of kCluster blocks (chunk = ceil(span / kCluster) vectors a
// block, up to kVecs a thread, in registers, storage type). Per slice a block computes its chunk's
// sum S_b and, from registers again, M2_b = sum (x - S_b / n_b)^2 (two-pass within the chunk), puts
// (S_b, M2_b) in distributed shared memory, and after one cluster barrier every thread merges the
// cluster's pairs exactly: mean = sum S_b / N, M2 = sum M2_b + n_b (S_b / n_b - mean)^2. Then
// y = act(fma(x, scale * rstd, bias - mean * scale * rstd)) from registers: X read once, Y written once.
// The grid is persistent (as many clusters as fit, each striding over the slices) and each block
// loads its chunk of the next slice before reducing the current one, so those loads are in flight
// during the barriers and the apply (round 3, a cluster per slice: 35-47 % of copy bandwidth,
// memory idle while short-lived blocks waited on three cluster barriers each).
// Otherwise: one block per (sample, group), Welford statistics, then a second sweep.
#include "group_norm_act/group_norm_act.cuh"

#include <atomic>

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/cuda_check.h"
#include "common/dtype.cuh"
#include "common/vec_math.cuh"

namespace deployfuse {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kClusterThreads = 256;
constexpr int kCluster = 8;
constexpr int kMaxVecs = 8;  // vectors a thread: slices up to kCluster * 8 * 256 = 16384 vectors

template <typename T, int kVecs>
__device__ __forceinline__ void load_chunk(Vec<T> (&v)[kVecs], const Vec<T>* __restrict__ xs, int begin, int end) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int i = begin + static_cast<int>(threadIdx.x) + j * kClusterThreads;
    if (i < end) v[j] = xs[i];
  }
}

// One launch handles every slice: cluster c takes slices c, c + clusters, ... (the same count for
// each block of a cluster, so their barriers pair up). In-slice indices fit an int (<= 16384).
template <typename T, int kVecs, Act kAct>
__global__ void __launch_bounds__(kClusterThreads, kVecs <= 4 ? 3 : 2) group_norm_act_cluster_kernel(const Vec<T>* __restrict__ x, const T* __restrict__ scale,
                                                                                    const T* __restrict__ bias, Vec<T>* __restrict__ y,
                                                                                    int64_t slices, int span_vectors, int spatial_vectors,
                                                                                    int group_channels, int64_t groups, float inv_span, float epsilon) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int K = Vec<T>::kSize;
  constexpr int kPairs = K / 2;
  // (S_b, M2_b) of this block's chunk, double-buffered by slice parity: a block writes buffer p
  // again two slices later, after the barrier of the slice in between, which every block of the
  // cluster reaches only once it has read buffer p.
  __shared__ float2 s_part[2];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int chunk = (span_vectors + kCluster - 1) / kCluster;
  const int begin = rank * chunk;
  const int end = begin + chunk < span_vectors ? begin + chunk : span_vectors;
  const float n_block = begin < end ? static_cast<float>((end - begin) * K) : 0.f;
  const int64_t stride = gridDim.x / kCluster;
  // Channel (within the group) of each of this thread's vectors: the same in every slice, and a
  // vector never straddles two channels (spatial % K == 0).
  int channel[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) channel[j] = (begin + static_cast<int>(threadIdx.x) + j * kClusterThreads) / spatial_vectors;

  Vec<T> v[kVecs], next[kVecs];
  int64_t slice = blockIdx.x / kCluster;
  load_chunk(v, x + slice * span_vectors, begin, end);
  for (int parity = 0; slice < slices; slice += stride, parity ^= 1) {
    if (slice + stride < slices) load_chunk(next, x + (slice + stride) * span_vectors, begin, end);  // in flight until the loop's end
    const int64_t first_channel = (slice % groups) * group_channels;
    float a[kVecs], b[kVecs];  // scale, bias of each vector's channel (loads issued before the reductions)
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (begin + static_cast<int>(threadIdx.x) + j * kClusterThreads < end) {
        a[j] = to_float(scale[first_channel + channel[j]]);
        b[j] = to_float(bias[first_channel + channel[j]]);
      }
    }
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (begin + static_cast<int>(threadIdx.x) + j * kClusterThreads < end) {
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          const float2 f = pair_to_float2(v[j], k);
          sum += f.x + f.y;
        }
      }
    }
    const float block_total = block_sum(sum);
    const float block_mean = n_block > 0.f ? __fdividef(block_total, n_block) : 0.f;  // n_block <= 2^14: ~2 ulp
    float sq = 0.f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      opaque(v[j]);  // convert again rather than keep the floats of the pass above alive
      if (begin + static_cast<int>(threadIdx.x) + j * kClusterThreads < end) {
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          const float2 f = pair_to_float2(v[j], k);
          const float d0 = f.x - block_mean, d1 = f.y - block_mean;
          sq = fmaf(d0, d0, sq);
          sq = fmaf(d1, d1, sq);
        }
      }
    }
    const float block_m2 = block_sum(sq);
    if (threadIdx.x == 0) s_part[parity] = make_float2(block_total, block_m2);
    cluster.sync();
    float2 part[kCluster];
#pragma unroll
    for (int r = 0; r < kCluster; ++r) part[r] = *cluster.map_shared_rank(&s_part[parity], r);
    float total = 0.f;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) total += part[r].x;
    const float mean = total * inv_span;
    float m2 = 0.f;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) {
      const int rb = r * chunk, re = rb + chunk < span_vectors ? rb + chunk : span_vectors;
      if (rb < re) {
        const float n = static_cast<float>((re - rb) * K);
        const float d = __fdividef(part[r].x, n) - mean;
        m2 += fmaf(n * d, d, part[r].y);
      }
    }
    const float inv_std = rsqrtf(m2 * inv_span + epsilon);
    Vec<T>* ys = y + slice * span_vectors;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      opaque(v[j]);
      const int i = begin + static_cast<int>(threadIdx.x) + j * kClusterThreads;
      if (i < end) {
        const float sa = a[j] * inv_std;
        const float sb = fmaf(-mean, sa, b[j]);
        Vec<T> o;
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          const float2 f = pair_to_float2(v[j], k);
          set_pair(o, k, act_lean<kAct>(fmaf(f.x, sa, sb)), act_lean<kAct>(fmaf(f.y, sa, sb)));
        }
        ys[i] = o;
      }
    }
#pragma unroll
    for (int j = 0; j < kVecs; ++j) v[j] = next[j];
  }
  cluster.sync();  // no block leaves while another may still read its s_part
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

void set_cluster_config(cudaLaunchConfig_t* config, cudaLaunchAttribute* attribute, unsigned clusters, cudaStream_t stream) {
  *config = {};
  config->gridDim = dim3(clusters * kCluster);
  config->blockDim = dim3(kClusterThreads);
  config->stream = stream;
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = kCluster;
  attribute->val.clusterDim.y = 1;
  attribute->val.clusterDim.z = 1;
  config->attrs = attribute;
  config->numAttrs = 1;
}

// Clusters of this kernel the device holds at once (0: unknown), cached per device.
template <typename T, int kVecs, Act kAct>
int resident_clusters() {
  static std::atomic<int> cache[64];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (device >= 0 && device < 64 && cache[device].load() > 0) return cache[device].load();
  cudaLaunchConfig_t config;
  cudaLaunchAttribute attribute;
  set_cluster_config(&config, &attribute, 1, nullptr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, reinterpret_cast<const void*>(group_norm_act_cluster_kernel<T, kVecs, kAct>), &config) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it, and launch a cluster per slice instead
    return 0;
  }
  if (device >= 0 && device < 64 && clusters > 0) cache[device].store(clusters);
  return clusters;
}

template <typename T, int kVecs, Act kAct>
cudaError_t launch_cluster(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t n, int64_t channels,
                           int64_t spatial, int64_t groups, float epsilon) {
  constexpr int K = Vec<T>::kSize;
  const int64_t group_channels = channels / groups, span = group_channels * spatial, slices = n * groups;
  // Persistent grid: at most the resident clusters, and as few as keep every cluster's slice count
  // equal (512 slices on 66 resident clusters: 64 clusters x 8 slices, not 66 with a ragged end).
  const int64_t resident = resident_clusters<T, kVecs, kAct>();
  int64_t clusters = resident > 0 && resident < slices ? resident : slices;
  if (clusters > 0x7fffffff / kCluster) clusters = 0x7fffffff / kCluster;
  const int64_t per_cluster = (slices + clusters - 1) / clusters;
  clusters = (slices + per_cluster - 1) / per_cluster;
  cudaLaunchConfig_t config;
  cudaLaunchAttribute attribute;
  set_cluster_config(&config, &attribute, static_cast<unsigned>(clusters), stream);
  return cudaLaunchKernelEx(&config, group_norm_act_cluster_kernel<T, kVecs, kAct>, reinterpret_cast<const Vec<T>*>(x), scale, bias,
                            reinterpret_cast<Vec<T>*>(y), slices, static_cast<int>(span / K), static_cast<int>(spatial / K),
                            static_cast<int>(group_channels), groups, 1.f / static_cast<float>(span), epsilon);
}

template <typename T, int kVecs>
cudaError_t launch_cluster(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t n, int64_t channels,
                           int64_t spatial, int64_t groups, float epsilon, Act act) {
  switch (act) {  // the activations GroupNormAct accepts
    case Act::kSilu: return launch_cluster<T, kVecs, Act::kSilu>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon);
    case Act::kGelu: return launch_cluster<T, kVecs, Act::kGelu>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon);
    default: return launch_cluster<T, kVecs, Act::kNone>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon);
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
  if (spatial % K == 0 && aligned16(x) && aligned16(y) && chunk <= kMaxVecs * kClusterThreads && has_clusters()) {
    if (chunk <= kClusterThreads) return launch_cluster<T, 1>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, act);
    if (chunk <= 2 * kClusterThreads) return launch_cluster<T, 2>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, act);
    if (chunk <= 4 * kClusterThreads) return launch_cluster<T, 4>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, act);
    return launch_cluster<T, kMaxVecs>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, act);
  }
  group_norm_act_kernel<T><<<static_cast<unsigned>(n * groups), kThreads, 0, stream>>>(x, scale, bias, y, channels / groups, spatial,
                                                                                       groups, epsilon, act);
  return cudaGetLastError();
}

template cudaError_t launch_group_norm_act<float>(cudaStream_t, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, float, Act);
template cudaError_t launch_group_norm_act<__half>(cudaStream_t, const __half*, const __half*, const __half*, __half*, int64_t, int64_t, int64_t, int64_t, float, Act);
template cudaError_t launch_group_norm_act<__nv_bfloat16>(cudaStream_t, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t, int64_t, int64_t, int64_t, float, Act);

}  // namespace deployfuse
