// Two paths. On Hopper (sm_90+), when spatial is a whole number of 16-byte vectors, X and Y are
// 16-byte aligned and a (sample, group) slice is at most kMaxCluster * 128 KiB, a persistent grid
// streams X through shared memory with the bulk copy engine:
// - A (sample, group) slice of NCHW is contiguous. It is split over a cluster of C blocks, block r
//   taking the vectors [r * chunk, (r + 1) * chunk) (C = 1 where the chunk fits one block, e.g. a
//   16x64x64 fp16 slice; more for larger slices, or to spread few slices over more SMs); each
//   cluster strides over the slices.
// - A producer warp copies the block's chunk of each slice in 16 KiB pieces (cp.async.bulk into a
//   ring slot, completing on the slot's mbarrier). Consumer warps hold a slot until they have
//   written its outputs, then release it for the producer to refill, so the next slice's first
//   pieces load while this one is reduced and applied, and loads take no registers.
// - Statistics in one sweep, exact: per piece each thread takes mean and M2 = sum (x - mean)^2 of
//   its vectors (two-pass over their floats, kept in registers), then Chan's merge of (n, mean, M2)
//   into its running moments, over the warp, the block and, for C > 1, the cluster: each block
//   pushes its moments into every block's shared memory and arrives on their mbarrier (no
//   cluster-wide barrier), and every block merges them in rank order, so all get the same mean
//   and variance.
// - A table in shared memory of (a, b) = (scale * rstd, bias - mean * scale * rstd) for the chunk's
//   channels, an entry a consumer thread (launch_ring sizes the cluster so that a chunk spans at
//   most kConsumers channels), filled after the statistics from scale and bias loaded before them.
// - y = act(fma(x, a, b)) from shared memory: per vector a fast_div for the channel and one 8-byte
//   shared load for (a, b); stored evict-first (X is loaded evict-first too): X read once, Y
//   written once. 16-bit silu takes every second element through silu_one_mufu (one MUFU op, not
//   two: the apply loop was bound by the MUFU pipe, 16 results a clock an SM).
// Two shapes of the kernel, Ring<kBlocks>: one block an SM (16 consumer warps, 13 slots, chunks up
// to 128 KiB) or two (8 consumer warps and 6 slots each, chunks up to 64 KiB), where each block
// fills the other's waits for its cluster; launch_ring picks.
// What bounds it (H200, copy 4231 GB/s): 16x512x64x64 silu fp16 42.9 us = 74 % of copy, bf16 73 %,
// fp32 84 %; 32x512x64x64 16-bit 80 %, 16x512x128x128 16-bit 71 %. About 18 SASS instructions an
// element (statistics 6.7, apply 11.5; 22 before the table). Without the activation fp16
// 16x512x64x64 runs at 78 %: what is left is the structure, no output of a slice before all of it
// has arrived and been reduced, and no loads while the ring is full of slices being reduced.
// History: round 3, a cluster per slice, chunk in registers (35-47 % of copy bandwidth); round 4,
// persistent, the next chunk loaded into registers before reducing this one (51-64 %); the ring
// (60-65 %); the (a, b) table, floats kept between the passes, shared loads at precomputed
// addresses and silu_one_mufu (71-80 %; silu_one_mufu's share 1-2 %: 42.9 against 43.4 us, 177
// against 181 us at 16x512x128x128). Measured and dropped: the chunk in registers with the ring only
// for staging (no faster, fp32 5 % slower), smaller chunks over more blocks (a cluster wait each:
// slower; Ring<2> for 16-bit 16x512x64x64, 44.6 us against 42.9), programmatic dependent launch.
// Otherwise: one block per (sample, group), Welford statistics, then a second sweep.
#include "group_norm_act/group_norm_act.cuh"

#include <atomic>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/arch_check.h"
#include "common/async_copy.cuh"
#include "common/cuda_check.h"
#include "common/dtype.cuh"
#include "common/shared_mem.cuh"
#include "common/vec_math.cuh"

namespace deployfuse {
namespace {

constexpr int kThreads = 512;    // fallback
constexpr int kPieceVecs = 1024;  // 16 KiB: the unit of copy and release
constexpr int kMaxCluster = 8;    // portable cluster size

// The ring kernel's shape for kBlocks blocks an SM. A block's chunk takes at most kMaxChunkPieces
// slots, so at least kSlots - kMaxChunkPieces pieces of the next slice load while it is reduced.
template <int kBlocks>
struct Ring {
  static constexpr int kConsumerWarps = 16 / kBlocks;
  static constexpr int kConsumers = 32 * kConsumerWarps;
  static constexpr int kThreads = kConsumers + 32;  // + the producer warp
  static constexpr int kSlots = kBlocks == 1 ? 13 : 6;
  static constexpr int kMaxChunkPieces = kBlocks == 1 ? 8 : 4;
  static constexpr size_t kBytes = size_t{kSlots} * kPieceVecs * 16;  // 208 / 96 KiB
};

struct FastDiv {  // see fast_div
  unsigned mul, shift;
};

FastDiv make_fast_div(unsigned d) {
  unsigned p = 0;
  while ((1ull << p) < d) ++p;
  return {static_cast<unsigned>((1ull << (32 + p)) / d - (1ull << 32) + 1), p};
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // the ring kernel's helpers (left out of older device passes)
// Count, mean and sum of squared deviations of a set of elements.
struct Moments {
  float n, mean, m2;
};

// Chan et al.: moments of the union of two disjoint sets (either may be empty).
__device__ __forceinline__ Moments merge(Moments a, Moments b) {
  const float n = a.n + b.n;
  const float w = n > 0.f ? b.n * rcp_ftz(n) : 0.f;
  const float d = b.mean - a.mean;
  return {n, fmaf(d, w, a.mean), a.m2 + fmaf(d * d * a.n, w, b.m2)};
}

// Lane 0 gets the moments of lanes [0, kWidth).
template <int kWidth>
__device__ __forceinline__ Moments warp_merge(Moments m) {
#pragma unroll
  for (int off = kWidth / 2; off > 0; off >>= 1) {
    const Moments o = {__shfl_down_sync(0xffffffffu, m.n, off), __shfl_down_sync(0xffffffffu, m.mean, off),
                       __shfl_down_sync(0xffffffffu, m.m2, off)};
    m = merge(m, o);
  }
  return m;
}

__device__ __forceinline__ Moments broadcast0(Moments m) {
  return {__shfl_sync(0xffffffffu, m.n, 0), __shfl_sync(0xffffffffu, m.mean, 0), __shfl_sync(0xffffffffu, m.m2, 0)};
}

// n / d for 0 <= n < 2^31 by multiply-high (Granlund & Montgomery): p = ceil(log2 d),
// mul = floor(2^(32 + p) / d) - 2^32 + 1, n / d = (umulhi(n, mul) + n) >> p.
__device__ __forceinline__ int fast_div(int n, FastDiv d) { return static_cast<int>((__umulhi(n, d.mul) + n) >> d.shift); }

// act of two elements. 16-bit silu: the second by silu_one_mufu, three MUFU ops a pair instead of
// four (the apply loop is bound by the MUFU pipe; fp32's tolerance wants the exact reciprocal).
template <typename T, Act kAct>
__device__ __forceinline__ float2 act_pair(float a, float b) {
  if constexpr (kAct == Act::kSilu && sizeof(T) == 2) return make_float2(act_lean<kAct>(a), silu_one_mufu(b));
  return make_float2(act_lean<kAct>(a), act_lean<kAct>(b));
}

template <int kCount>
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kCount) : "memory");
}
#endif

// gridDim.x = clusters * C; cluster c takes slices c, c + clusters, ...; block `rank` of a cluster
// the vectors [rank * chunk, rank * chunk + chunk) of each (fewer or none for the last ranks), in
// `pieces` pieces. In-slice vector indices fit an int (<= kMaxCluster * 8 * kPieceVecs).
template <typename T, Act kAct, int kBlocks>
__global__ void __launch_bounds__(Ring<kBlocks>::kThreads, kBlocks) group_norm_act_ring_kernel(
    const Vec<T>* __restrict__ x, const T* __restrict__ scale, const T* __restrict__ bias, Vec<T>* __restrict__ y, int64_t slices,
    int span_vectors, int chunk, int pieces, FastDiv spatial_vectors, int group_channels, int64_t groups, float inv_span, float epsilon) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using R = Ring<kBlocks>;
  constexpr int K = Vec<T>::kSize;
  constexpr int kPairs = K / 2;
  constexpr int kPer = kPieceVecs / R::kConsumers;  // vectors of a piece a thread
  extern __shared__ __align__(128) unsigned char ring_bytes[];
  Vec<T>* ring = reinterpret_cast<Vec<T>*>(ring_bytes);
  __shared__ uint64_t full[R::kSlots], empty[R::kSlots];  // piece landed / piece done by every consumer warp
  __shared__ uint64_t moments_in[2];                      // the cluster's moments of a slice arrived (by slice parity)
  __shared__ float4 cluster_moments[2][kMaxCluster];
  __shared__ float4 warp_moments[2][R::kConsumerWarps];
  __shared__ float2 coef[R::kConsumers];                  // (a, b) of the chunk's channels

  const int rank = static_cast<int>(cluster_rank()), blocks = static_cast<int>(cluster_size());
  const int64_t first_slice = blockIdx.x / blocks, stride = gridDim.x / blocks;
  const int begin = rank * chunk;
  const int len = min(chunk, span_vectors - begin);  // <= 0: an empty chunk
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < R::kSlots; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], R::kConsumerWarps);
    }
    mbar_init(&moments_in[0], blocks);
    mbar_init(&moments_in[1], blocks);
    fence_mbar_init();
  }
  cluster_sync();  // peers arrive on moments_in only once it is initialised

  if (warp == R::kConsumerWarps) {  // producer
    if (lane == 0) {
      const uint64_t policy = l2_evict_first();
      int slot = 0;
      unsigned phase = 0;
      for (int64_t s = first_slice; s < slices; s += stride) {
        const Vec<T>* src = x + s * span_vectors + begin;
        for (int j = 0; j < pieces; ++j) {
          mbar_wait(&empty[slot], phase ^ 1);  // the slot's previous piece is done (a fresh slot: at once)
          const int n = max(0, min(kPieceVecs, len - j * kPieceVecs));
          mbar_arrive_expect_tx(&full[slot], n * 16);
          if (n > 0) bulk_load(ring + slot * kPieceVecs, src + j * kPieceVecs, n * 16, &full[slot], policy);
          if (++slot == R::kSlots) slot = 0, phase ^= 1;
        }
      }
    }
    __syncwarp();
  } else {  // consumers
    const int tid = threadIdx.x;
    // The chunk's channels of its group: [c_first, c_first + chunk_channels), at most kConsumers.
    const int c_first = len > 0 ? fast_div(begin, spatial_vectors) : 0;
    const int chunk_channels = len > 0 ? fast_div(begin + len - 1, spatial_vectors) - c_first + 1 : 0;
    // Shared-window addresses, formed once (as pointers they were rebuilt for every vector).
    const uint32_t ring_at = smem_addr(ring) + tid * 16;
    const uint32_t coef_at = smem_addr(coef) - c_first * 8;  // + channel * 8
    int slot = 0;
    unsigned phase = 0;
    for (int64_t s = first_slice, k = 0; s < slices; s += stride, ++k) {
      // This thread's entry of the coefficient table: scale and bias load while the moments are taken.
      float g = 0.f, h = 0.f;
      if (tid < chunk_channels) {
        const int64_t c = (s % groups) * group_channels + c_first + tid;
        g = to_float(scale[c]);
        h = to_float(bias[c]);
      }
      const int first_slot = slot;
      Moments acc = {0.f, 0.f, 0.f};
      for (int j = 0; j < pieces; ++j) {
        mbar_wait(&full[slot], phase);
        const uint32_t at = ring_at + slot * (kPieceVecs * 16);
        const int n = len - j * kPieceVecs - tid;  // this thread's vectors u * kConsumers < n exist
        // Two passes over the thread's vectors of the piece, from registers; a full piece (all but
        // maybe the last) without the per-vector bounds.
        const auto moments = [&](auto whole) -> Moments {
          constexpr bool kWhole = decltype(whole)::value;
          float2 f[kPer][kPairs];
          int count = 0;
          float sum = 0.f;
#pragma unroll
          for (int u = 0; u < kPer; ++u) {
            if (kWhole || u * R::kConsumers < n) {
              const Vec<T> v = as_vec<T>(ld_shared_v4(at + u * (R::kConsumers * 16)));
              ++count;
#pragma unroll
              for (int p = 0; p < kPairs; ++p) f[u][p] = pair_to_float2(v, p);
              float vs = f[u][0].x + f[u][0].y;
#pragma unroll
              for (int p = 1; p < kPairs; ++p) vs += f[u][p].x + f[u][p].y;
              sum = u == 0 ? vs : sum + vs;
            }
          }
          if (count == 0) return {0.f, 0.f, 0.f};
          const float n_local = static_cast<float>(count * K);
          const float mean = sum * (kWhole ? 1.f / (kPer * K) : rcp_ftz(n_local));
          float m2 = 0.f;
#pragma unroll
          for (int u = 0; u < kPer; ++u) {
            if (kWhole || u < count) {
              float vm = 0.f;
#pragma unroll
              for (int p = 0; p < kPairs; ++p) {
                const float d0 = f[u][p].x - mean, d1 = f[u][p].y - mean;
                vm = p == 0 ? d0 * d0 : fmaf(d0, d0, vm);
                vm = fmaf(d1, d1, vm);
              }
              m2 = u == 0 ? vm : m2 + vm;
            }
          }
          return {n_local, mean, m2};
        };
        const Moments piece = n > (kPer - 1) * R::kConsumers ? moments(std::true_type()) : moments(std::false_type());
        acc = merge(acc, piece);
        if (++slot == R::kSlots) slot = 0, phase ^= 1;
      }
      // Block: warps, then every warp merges the warps' moments in the same order (same result).
      const int parity = static_cast<int>(k & 1);
      acc = warp_merge<32>(acc);
      if (lane == 0) warp_moments[parity][warp] = make_float4(acc.n, acc.mean, acc.m2, 0.f);
      consumer_sync<R::kConsumers>();  // double-buffered by parity: the next write to this buffer follows the next sync
      float4 w = lane < R::kConsumerWarps ? warp_moments[parity][lane] : make_float4(0.f, 0.f, 0.f, 0.f);
      Moments total = broadcast0(warp_merge<R::kConsumerWarps>({w.x, w.y, w.z}));
      if (blocks > 1) {
        // Push to every block (itself included). A block pushes slice k + 2 into this buffer only
        // after it has received this block's moments of slice k + 1, sent after this block read it.
        if (warp == 0 && lane < blocks) {
          st_cluster(cluster_addr(&cluster_moments[parity][rank], lane), make_float4(total.n, total.mean, total.m2, 0.f));
          mbar_arrive_cluster(cluster_addr(&moments_in[parity], lane));
        }
        mbar_wait<true>(&moments_in[parity], static_cast<unsigned>(k >> 1) & 1);
        w = cluster_moments[parity][0];
        total = {w.x, w.y, w.z};
        for (int r = 1; r < blocks; ++r) {
          w = cluster_moments[parity][r];
          total = merge(total, {w.x, w.y, w.z});
        }
      }
      // y = act(x * a + b) with a = scale * rstd, b = bias - mean * a per channel. The table's
      // readers of the previous slice are past the sync above.
      const float inv_std = rsqrtf(total.m2 * inv_span + epsilon);
      if (tid < chunk_channels) {
        const float a = g * inv_std;
        coef[tid] = make_float2(a, fmaf(-total.mean, a, h));
      }
      consumer_sync<R::kConsumers>();
      Vec<T>* ys = y + s * span_vectors + begin + tid;
      int out_slot = first_slot;
      for (int j = 0; j < pieces; ++j) {
        const uint32_t at = ring_at + out_slot * (kPieceVecs * 16);
        const int n = len - j * kPieceVecs - tid;
        const int first = begin + j * kPieceVecs + tid;  // in-slice index of the thread's first vector
#pragma unroll
        for (int u = 0; u < kPer; ++u) {
          if (u * R::kConsumers < n) {
            const float2 ab = ld_shared_f2(coef_at + fast_div(first + u * R::kConsumers, spatial_vectors) * 8);
            const Vec<T> v = as_vec<T>(ld_shared_v4(at + u * (R::kConsumers * 16)));
            Vec<T> o;
#pragma unroll
            for (int p = 0; p < kPairs; ++p) {
              const float2 f = pair_to_float2(v, p);
              const float2 r = act_pair<T, kAct>(fmaf(f.x, ab.x, ab.y), fmaf(f.y, ab.x, ab.y));
              set_pair(o, p, r.x, r.y);
            }
            __stcs(reinterpret_cast<uint4*>(ys + j * kPieceVecs + u * R::kConsumers), *reinterpret_cast<const uint4*>(o.v));
          }
        }
        __syncwarp();  // the warp's reads of the slot are done (their values are stored)
        if (lane == 0) mbar_arrive(&empty[out_slot]);
        if (++out_slot == R::kSlots) out_slot = 0;
      }
    }
  }
  cluster_sync();  // no block leaves while a peer may still push to it
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

// A 9.0+ GPU and ring kernels compiled for it (their body is empty below sm_90).
bool has_clusters() {
  static ArchCheck built_for;
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 9 && built_for(reinterpret_cast<const void*>(group_norm_act_ring_kernel<float, Act::kNone, 1>), 90);
}

template <int kBlocks>
void set_ring_config(cudaLaunchConfig_t* config, cudaLaunchAttribute* attribute, unsigned clusters, int blocks, cudaStream_t stream) {
  *config = {};
  config->gridDim = dim3(clusters * blocks);
  config->blockDim = dim3(Ring<kBlocks>::kThreads);
  config->dynamicSmemBytes = Ring<kBlocks>::kBytes;
  config->stream = stream;
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = blocks;
  attribute->val.clusterDim.y = 1;
  attribute->val.clusterDim.z = 1;
  config->attrs = attribute;
  config->numAttrs = 1;
}

// Clusters of `blocks` blocks of this kernel the device holds at once (0: none or unknown), cached
// per device; the first call also raises the kernel's shared-memory limit.
template <typename T, Act kAct, int kBlocks>
int resident_clusters(int blocks) {
  static std::atomic<int> cache[64][4];  // by device, log2(blocks)
  const auto kernel = group_norm_act_ring_kernel<T, kAct, kBlocks>;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) {
    cudaGetLastError();
    return 0;
  }
  const int b = blocks == 1 ? 0 : blocks == 2 ? 1 : blocks == 4 ? 2 : 3;
  if (cache[device][b].load() > 0) return cache[device][b].load();
  cudaLaunchConfig_t config;
  cudaLaunchAttribute attribute;
  set_ring_config<kBlocks>(&config, &attribute, 1, blocks, nullptr);
  int clusters = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Ring<kBlocks>::kBytes)) != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it, and take the fallback
    return 0;
  }
  if (clusters > 0) cache[device][b].store(clusters);
  return clusters;
}

// false: the shape or the device does not take this ring shape.
template <typename T, Act kAct, int kBlocks>
bool launch_ring(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t n, int64_t channels, int64_t spatial,
                 int64_t groups, float epsilon, cudaError_t* status) {
  constexpr int K = Vec<T>::kSize;
  constexpr int64_t kMaxChunk = int64_t{Ring<kBlocks>::kMaxChunkPieces} * kPieceVecs;
  const int64_t group_channels = channels / groups, span = group_channels * spatial / K, slices = n * groups, spatial_vectors = spatial / K;
  // A chunk takes at most kMaxChunk vectors and touches at most kConsumers channels (the table).
  const auto fits = [&](int blocks) {
    const int64_t chunk = (span + blocks - 1) / blocks;
    return chunk <= kMaxChunk && (chunk + spatial_vectors - 2) / spatial_vectors + 1 <= Ring<kBlocks>::kConsumers;
  };
  int blocks = 1;
  while (blocks < kMaxCluster && !fits(blocks)) blocks *= 2;
  if (!fits(blocks)) return false;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // Few slices: spread each over more SMs while every block keeps at least a piece.
  while (blocks < kMaxCluster && slices * 2 * blocks <= int64_t{sms} * kBlocks && (span + 2 * blocks - 1) / (2 * blocks) >= kPieceVecs) blocks *= 2;
  const int64_t resident = resident_clusters<T, kAct, kBlocks>(blocks);
  if (resident <= 0) return false;
  // At most the resident clusters, and as few as keep every cluster's slice count equal.
  int64_t clusters = resident < slices ? resident : slices;
  const int64_t per_cluster = (slices + clusters - 1) / clusters;
  clusters = (slices + per_cluster - 1) / per_cluster;
  const int chunk = static_cast<int>((span + blocks - 1) / blocks);
  cudaLaunchConfig_t config;
  cudaLaunchAttribute attribute;
  set_ring_config<kBlocks>(&config, &attribute, static_cast<unsigned>(clusters), blocks, stream);
  *status = cudaLaunchKernelEx(&config, group_norm_act_ring_kernel<T, kAct, kBlocks>, reinterpret_cast<const Vec<T>*>(x), scale, bias,
                               reinterpret_cast<Vec<T>*>(y), slices, static_cast<int>(span), chunk, (chunk + kPieceVecs - 1) / kPieceVecs,
                               make_fast_div(static_cast<unsigned>(spatial_vectors)), static_cast<int>(group_channels), groups,
                               1.f / static_cast<float>(group_channels * spatial), epsilon);
  return true;
}

// Ring<1> while a slice spans at most two of its blocks; a larger slice takes Ring<2> where it fits
// (H200, before the (a, b) table: 16-bit 16x512x128x128 slices, 8 blocks of Ring<2>, 204 us against
// 220-225 us on 4 of Ring<1>; fp32 16x512x64x64, 2 blocks of Ring<1>, 83 us against 85 us on 4 of
// Ring<2>).
template <typename T, Act kAct>
bool launch_ring(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t n, int64_t channels, int64_t spatial,
                 int64_t groups, float epsilon, cudaError_t* status) {
  const int64_t span = channels / groups * spatial / Vec<T>::kSize;
  if (span > int64_t{2} * Ring<1>::kMaxChunkPieces * kPieceVecs &&
      launch_ring<T, kAct, 2>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, status)) {
    return true;
  }
  return launch_ring<T, kAct, 1>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, status);
}

template <typename T>
bool launch_ring(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t n, int64_t channels, int64_t spatial,
                 int64_t groups, float epsilon, Act act, cudaError_t* status) {
  switch (act) {  // the activations GroupNormAct accepts
    case Act::kSilu: return launch_ring<T, Act::kSilu>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, status);
    case Act::kGelu: return launch_ring<T, Act::kGelu>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, status);
    default: return launch_ring<T, Act::kNone>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, status);
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
  cudaError_t status = cudaSuccess;
  if (spatial % K == 0 && aligned16(x) && aligned16(y) && has_clusters() &&
      launch_ring<T>(stream, x, scale, bias, y, n, channels, spatial, groups, epsilon, act, &status)) {
    return status;
  }
  group_norm_act_kernel<T><<<static_cast<unsigned>(n * groups), kThreads, 0, stream>>>(x, scale, bias, y, channels / groups, spatial,
                                                                                       groups, epsilon, act);
  return cudaGetLastError();
}

template cudaError_t launch_group_norm_act<float>(cudaStream_t, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, float, Act);
template cudaError_t launch_group_norm_act<__half>(cudaStream_t, const __half*, const __half*, const __half*, __half*, int64_t, int64_t, int64_t, int64_t, float, Act);
template cudaError_t launch_group_norm_act<__nv_bfloat16>(cudaStream_t, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t, int64_t, int64_t, int64_t, float, Act);

}  // namespace deployfuse
