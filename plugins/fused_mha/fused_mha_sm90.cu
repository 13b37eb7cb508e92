// Hopper FusedMHA forward: flash attention on warpgroup MMAs (wgmma) fed by TMA, fp16/bf16 in, fp32
// accumulation. Built for sm_90a only (wgmma and setmaxnreg are arch-specific); see wgmma.cuh for
// the register and shared-memory layouts.
//
// A work item is kBlockM = 64 * kConsumers query rows of one (batch, head). A CTA has kConsumers
// warpgroups of 64 rows and one producer warpgroup, which hands its registers to them (setmaxnreg)
// and whose one elected thread loads each item's Q, then its K_j and V_j (kBlockN = 128 keys) into a
// kStages-deep ring by TMA (128-byte swizzle; rows past the sequence arrive as zeros). "full"
// mbarriers count the bytes in, "empty" ones count the consumer threads out, so warpgroups wait only
// on data, never on each other. CTAs are persistent (but for causal calls over several key tiles:
// launch_with): at most as many as fit on the GPU at once, each taking items blockIdx.x,
// blockIdx.x + gridDim.x, ...; the ring and its phases run on across items,
// so the producer loads the next item's Q (once the consumers' last S = Q K^T of this one is done)
// and K/V while the consumers still compute and store this one. At 128 keys an item is one key tile:
// one CTA an item left the SM's memory and tensor cores idle in turn through every CTA's start, loads
// and stores. Per key tile a consumer warpgroup computes
//   S  = Q K_j^T                     wgmma, A = Q and B = K_j from shared memory (K-major)
//   x  = (S * scale + mask) * log2(e), -inf past k_seq and above the causal diagonal
//   m' = max(m, rowmax x);  P = 2^(x - m');  l = l * 2^(m - m') + rowsum P;  O = O * 2^(m - m')
//   O += P V_j                       wgmma, A = P from registers (the S accumulators re-packed as
//                                    m16k16 fragments), B = V_j from shared memory (MN-major)
// issuing S_j+1 = Q K_j+1^T and P_j V_j back to back and running the softmax of S_j+1 while P_j V_j
// is still on the tensor cores. Y = O / l (0 where every key was masked, l == 0), stored from
// registers. The additive mask is read from global memory in the softmax (see Sm90Mask).
#include "fused_mha/fused_mha_sm90.cuh"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/async_copy.cuh"
#include "common/cuda_check.h"
#include "common/dtype.cuh"
#include "common/env_flag.h"
#include "common/shared_mem.cuh"
#include "fused_mha/flash_math.cuh"
#include "fused_mha/wgmma.cuh"
#include "fused_mha/yq.cuh"

namespace deployfuse {
namespace {

constexpr int kBlockN = 128;  // keys a tile
constexpr int kStages = 2;    // K/V tiles in flight

// Additive mask, staged per key tile by TMA next to K_j: none; one row shared by every query of the
// CTA (a [b, 1, 1, k] padding mask: 1 row); a row per query (kBlockM rows). Stored as two 64-key
// boxes with the 128-byte swizzle, which makes the softmax's reads (8 rows x 4 pairs of keys a warp)
// hit 32 different banks.
enum class Sm90Mask { kNone, kRow, kTile };

// kCtas CTAs share an SM. With one, a CTA whose keys fit in a tile or two spends most of its life
// waiting for its loads or its stores, and the SM's tensor cores and memory idle in turn; two 64-row
// CTAs (one consumer each) overlap one's loads with the other's math.
template <int D, int kConsumers, Sm90Mask kMask = Sm90Mask::kNone, int kCtas = 1>
struct Sm90Tile {
  static_assert(kCtas == 1 || (kConsumers == 1 && kCtas == 2), "two CTAs an SM are single-consumer CTAs");
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kThreads = 128 * (kConsumers + 1);  // + the producer warpgroup
  // Registers a consumer thread after the producer gives its own up (setmaxnreg): 64K an SM, the
  // producer keeping 24 a thread. One consumer of two CTAs: (32768 - 128 * 24) / 128 = 232.
  static constexpr int kConsumerRegs = kCtas == 2 ? 232 : kConsumers == 3 ? 160 : 240;
  static constexpr uint32_t kQBytes = kBlockM * D * 2;
  static constexpr uint32_t kKVBytes = kBlockN * D * 2;  // one K or V tile
  static constexpr int kMaskRows = kMask == Sm90Mask::kTile ? kBlockM : kMask == Sm90Mask::kRow ? 1 : 0;
  static constexpr uint32_t kMaskBox = kMaskRows * 128;                    // one 64-key box
  static constexpr uint32_t kMaskPitch = (kMaskBox + 1023) / 1024 * 1024;  // boxes start 1024-byte aligned
  static constexpr uint32_t kMaskBytes = 2 * kMaskPitch;                   // one stage
  static constexpr size_t kSmem = kQBytes + kStages * (2 * kKVBytes + kMaskBytes) + 1024;  // + slack for 1024-byte alignment
};

struct Sm90Params {
  float scale;  // scale * log2(e), > 0
  int q_seq, k_seq, heads;
  int q_blocks, items;  // kBlockM-row blocks of the queries; q_blocks * batch * heads work items
  bool causal;
  bool mask_b, mask_h;  // the mask varies over batch / heads (else its map has one there)
  const float* yq_scale;  // YQ (MhaYq): YScale on the device; yq null: not written
  uint8_t* yq;
};

template <typename T, int D, int kConsumers, Sm90Mask kMask, int kCtas>
__global__ void __launch_bounds__(Sm90Tile<D, kConsumers, kMask, kCtas>::kThreads, kCtas)
    fused_mha_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_m, T* __restrict__ y,
                          const Sm90Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  using Tile = Sm90Tile<D, kConsumers, kMask, kCtas>;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr int kCols = D / 64;  // 128-byte column blocks of a tile
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t bars[2 + 4 * kStages];  // full Q, empty Q, full K[s], full V[s], empty K[s], empty V[s]
  const uint32_t s_q = (smem_addr(smem_raw) + 1023) & ~1023u;
  const uint32_t s_k = s_q + Tile::kQBytes, s_v = s_k + kStages * Tile::kKVBytes, s_m = s_v + kStages * Tile::kKVBytes;
  uint64_t *full_q = bars, *empty_q = bars + 1;
  auto full_k = [&](int s) { return bars + 2 + s; };
  auto full_v = [&](int s) { return bars + 2 + kStages + s; };
  auto empty_k = [&](int s) { return bars + 2 + 2 * kStages + s; };
  auto empty_v = [&](int s) { return bars + 2 + 3 * kStages + s; };
  // Item i: query block q0 of head h of batch row b, n_tiles key tiles (fewer under causal: later keys
  // are masked for every row of the block). A head's blocks are consecutive items, the longest causal
  // ones first.
  struct Item {
    int q0, b, h, n_tiles;
  };
  auto item_at = [&](int i) {
    const int bh = i / p.q_blocks;
    Item it;
    it.q0 = (p.q_blocks - 1 - i % p.q_blocks) * Tile::kBlockM;
    it.b = bh / p.heads;
    it.h = bh % p.heads;
    const int kv_len = p.causal ? min(p.k_seq, it.q0 + Tile::kBlockM) : p.k_seq;
    it.n_tiles = (kv_len + kBlockN - 1) / kBlockN;
    return it;
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    mbar_init(full_q, 1);
    mbar_init(empty_q, 128 * kConsumers);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty_k(s), 128 * kConsumers);
      mbar_init(empty_v(s), 128 * kConsumers);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (warp >= 4 * kConsumers) {  // producer: one thread issues every load; its registers go to the consumers
    setmaxnreg_dec<24>();
    if (warp == 4 * kConsumers && lane == 0) {
      int tile = 0;  // key tiles loaded so far by this CTA: ring stage tile % kStages, its use (tile / kStages)
      for (int i = blockIdx.x, n = 0; i < p.items; i += gridDim.x, ++n) {
        const Item it = item_at(i);
        if (n > 0) mbar_wait(empty_q, (n - 1) & 1);  // the consumers' last S of the previous item has read Q
        mbar_arrive_expect_tx(full_q, Tile::kQBytes);
        for (int c = 0; c < kCols; ++c) tma_load_4d(s_q + c * Tile::kBlockM * 128, &tm_q, full_q, 64 * c, it.q0, it.h, it.b);
        for (int j = 0; j < it.n_tiles; ++j, ++tile) {
          const int s = tile % kStages;
          const uint32_t phase = (tile / kStages) & 1;
          if (tile >= kStages) mbar_wait(empty_k(s), phase ^ 1);
          mbar_arrive_expect_tx(full_k(s), Tile::kKVBytes + 2 * Tile::kMaskBox);
          for (int c = 0; c < kCols; ++c) tma_load_4d(s_k + s * Tile::kKVBytes + c * kBlockN * 128, &tm_k, full_k(s), 64 * c, j * kBlockN, it.h, it.b);
          if constexpr (kMask != Sm90Mask::kNone) {  // mask keys [128 j, 128 j + 128) of rows q0.. (kTile) or row 0 (kRow)
            for (int c = 0; c < 2; ++c) {
              tma_load_4d(s_m + s * Tile::kMaskBytes + c * Tile::kMaskPitch, &tm_m, full_k(s), j * kBlockN + 64 * c,
                          kMask == Sm90Mask::kTile ? it.q0 : 0, p.mask_h ? it.h : 0, p.mask_b ? it.b : 0);
            }
          }
          if (tile >= kStages) mbar_wait(empty_v(s), phase ^ 1);
          mbar_arrive_expect_tx(full_v(s), Tile::kKVBytes);
          for (int c = 0; c < kCols; ++c) tma_load_4d(s_v + s * Tile::kKVBytes + c * kBlockN * 128, &tm_v, full_v(s), 64 * c, j * kBlockN, it.h, it.b);
        }
      }
    }
    return;
  }

  setmaxnreg_inc<Tile::kConsumerRegs>();
  // Consumer warpgroup wg: rows q0 + 64 wg + 16 (warp % 4) + g (+ 8) of the thread's accumulators.
  const int wg = warp / 4, g = lane / 4, t = lane % 4;
  const int row_in_block = 64 * wg + 16 * (warp % 4) + g;
  const uint32_t q_wg = s_q + wg * 64 * 128;
  const int64_t ld = static_cast<int64_t>(p.heads) * D;  // Y's (and YQ's) row
  const E4m3Divisor yq_scale(p.yq ? *p.yq_scale : 1.f);
  int tile = 0;  // key tiles consumed so far by this CTA, as the producer counts them

  for (int i = blockIdx.x, n = 0; i < p.items; i += gridDim.x, ++n) {
    const Item it = item_at(i);
    const int row0 = it.q0 + row_in_block;
    const int rows[2] = {row0, row0 + 8};
    auto stage = [&](int j) { return (tile + j) % kStages; };
    auto phase = [&](int j) { return static_cast<uint32_t>((tile + j) / kStages) & 1; };
    auto s_tile = [&](float (&sc)[kBlockN / 2], int j) {  // issue S = Q K_j^T (committed, not waited for)
      const uint32_t k_tile = s_k + stage(j) * Tile::kKVBytes;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t col = (kk / 4), off = (kk % 4) * 32;
        wgmma_ss<kBf16>(sc, sw128_desc(q_wg + col * Tile::kBlockM * 128 + off, 16), sw128_desc(k_tile + col * kBlockN * 128 + off, 16), kk > 0);
      }
      wgmma_commit();
    };

    float o[D / 2];
#pragma unroll
    for (int e = 0; e < D / 2; ++e) o[e] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float sc[kBlockN / 2];
#pragma unroll
    for (int e = 0; e < kBlockN / 2; ++e) sc[e] = 0.f;
    uint32_t pa[kBlockN / 16][4];

    // sc[4 c + 2 r + e] += mask(row r, key 8 c + 2 t + e of tile j) / scale, so that the scale folded
    // into the exponent gives (S * scale + mask) * log2(e). This thread's mask row in the tile: its
    // row in the CTA (kTile) or the one row (kRow); 16-byte chunk c % 8 of that row sits at chunk
    // (c % 8) ^ (row % 8) of its 64-key box.
    const int m_row = kMask == Sm90Mask::kTile ? row_in_block : 0;
    auto add_mask = [&](int j) {
      const float mul = kLog2e / p.scale;
      const uint32_t m_tile = s_m + stage(j) * Tile::kMaskBytes;
#pragma unroll
      for (int c = 0; c < kBlockN / 8; ++c) {
#pragma unroll
        for (int r = 0; r < (kMask == Sm90Mask::kTile ? 2 : 1); ++r) {
          const int rr = m_row + 8 * r;
          const float2 mv = unpack2<T>(ld_shared_u32(m_tile + (c / 8) * Tile::kMaskPitch + rr * 128 + (((c % 8) ^ (rr % 8)) * 16) + 4 * t));
#pragma unroll
          for (int q = r; q < 2; q += (kMask == Sm90Mask::kTile ? 2 : 1)) {  // kRow: the one row serves rows g and g + 8
            sc[4 * c + 2 * q] = fmaf(mv.x, mul, sc[4 * c + 2 * q]);
            sc[4 * c + 2 * q + 1] = fmaf(mv.y, mul, sc[4 * c + 2 * q + 1]);
          }
        }
      }
    };

    // Online softmax of S_j in sc (flash_math.cuh): P_j in place, m and l updated, alpha per row. Only
    // the last tile and tiles crossing the diagonal need the bounds/causal test (warp-uniform).
    auto softmax = [&](int j, float (&alpha)[2]) {
      const int k0 = j * kBlockN;
      if constexpr (kMask != Sm90Mask::kNone) add_mask(j);
      if (k0 + kBlockN > p.k_seq || (p.causal && k0 + kBlockN - 1 > row0 - g)) {
#pragma unroll
        for (int c = 0; c < kBlockN / 8; ++c) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = k0 + 8 * c + 2 * t + (e & 1);
            if (key >= p.k_seq || (p.causal && key > rows[e >> 1])) sc[4 * c + e] = -INFINITY;
          }
        }
      }
      alpha[0] = online_softmax_row(sc, 0, p.scale, m[0], l[0]);
      alpha[1] = online_softmax_row(sc, 1, p.scale, m[1], l[1]);
    };
    auto pack_p = [&] {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) p_fragment<T>(sc, kk, pa[kk]);
    };

    mbar_wait(full_q, n & 1);
    if (it.n_tiles > 0) {
      float alpha[2];
      mbar_wait(full_k(stage(0)), phase(0));
      s_tile(sc, 0);
      wgmma_wait<0>();
      fence_regs(sc);
      if constexpr (kMask == Sm90Mask::kNone) mbar_arrive(empty_k(stage(0)));
      softmax(0, alpha);  // O is still 0: alpha unused
      if constexpr (kMask != Sm90Mask::kNone) mbar_arrive(empty_k(stage(0)));  // the mask tile shares K's stage
      pack_p();
    }
    if (it.n_tiles <= 1) mbar_arrive(empty_q);  // every S of this item is done: the producer may load the next Q
    // Tile j: S_j+1 = Q K_j+1^T and O += P_j V_j go to the tensor cores back to back; the softmax of
    // S_j+1 runs while P_j V_j is in flight, then O is rescaled and P_j+1 packed.
    auto pv_tile = [&](int j) {
      mbar_wait(full_v(stage(j)), phase(j));
      const uint32_t v_tile = s_v + stage(j) * Tile::kKVBytes;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) wgmma_rs_t<kBf16>(o, pa[kk], sw128_desc(v_tile + kk * 2048, kBlockN * 128));
      wgmma_commit();
    };
    for (int j = 0; j + 1 < it.n_tiles; ++j) {
      float alpha[2];
      mbar_wait(full_k(stage(j + 1)), phase(j + 1));
      s_tile(sc, j + 1);
      pv_tile(j);
      wgmma_wait<1>();  // S_j+1 done, P_j V_j may still run
      fence_regs(sc);
      if (j + 2 == it.n_tiles) mbar_arrive(empty_q);
      if constexpr (kMask == Sm90Mask::kNone) mbar_arrive(empty_k(stage(j + 1)));
      softmax(j + 1, alpha);
      if constexpr (kMask != Sm90Mask::kNone) mbar_arrive(empty_k(stage(j + 1)));
      wgmma_wait<0>();
      fence_regs(o);
      for (auto& frag : pa) fence_regs(frag);  // P_j V_j has read them
      mbar_arrive(empty_v(stage(j)));
#pragma unroll
      for (int c = 0; c < D / 8; ++c) {
        o[4 * c] *= alpha[0];
        o[4 * c + 1] *= alpha[0];
        o[4 * c + 2] *= alpha[1];
        o[4 * c + 3] *= alpha[1];
      }
      pack_p();
    }
    if (it.n_tiles > 0) {
      pv_tile(it.n_tiles - 1);
      wgmma_wait<0>();
      fence_regs(o);
      mbar_arrive(empty_v(stage(it.n_tiles - 1)));  // the next item's V may land in this stage
    }

    // Epilogue: Y = O / l from registers (each quad writes 16 contiguous bytes of a row per column tile), and YQ from
    // those values as rounded to T (8 bytes a quad).
    const int64_t base = static_cast<int64_t>(it.b) * p.q_seq * ld + it.h * D + 2 * t;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float inv = row_inverse_sum(l[r]);
      if (rows[r] < p.q_seq) {
        const int64_t at = base + rows[r] * ld;
#pragma unroll
        for (int c = 0; c < D / 8; ++c) {
          const uint32_t pair = pack2<T>(o[4 * c + 2 * r] * inv, o[4 * c + 2 * r + 1] * inv);
          if (y) *reinterpret_cast<uint32_t*>(y + at + 8 * c) = pair;
          if (p.yq) {
            const T* e = reinterpret_cast<const T*>(&pair);
            *reinterpret_cast<uint16_t*>(p.yq + at + 8 * c) = e4m3_pair(e[0], e[1], yq_scale);
          }
        }
      }
    }
    tile += it.n_tiles;
  }
#else
  __trap();  // launch_fused_mha_sm90 only launches on sm_90a code
#endif
}

// cuTensorMapEncodeTiled from the driver, through the runtime (no -lcuda); null when unavailable.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &found);
#endif
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<EncodeTiledFn>(f) : nullptr;
  }();
  return fn;
}

// A 4-D tensor map of 16-bit T (dims and byte strides innermost first) read in boxes of 64 x rows
// with the 128-byte swizzle; false when the driver refuses it.
template <typename T>
bool encode_map(CUtensorMap* map, const T* base, const cuuint64_t (&dims)[4], const cuuint64_t (&strides)[3], int rows) {
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode_tiled()(map, type, 4, const_cast<T*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Q, K or V, [batch, seq, heads, D] with rows `ld` elements apart, as [D, seq, heads, batch]: a box
// is 64 head values of `rows` sequence positions of one head. False when TMA cannot read it (a row
// stride that is not a multiple of 16 bytes).
template <typename T>
bool make_map(CUtensorMap* map, const T* base, const MhaShape& s, int64_t seq, int64_t ld, int rows) {
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(ld) * sizeof(T);
  if (row_bytes % 16 != 0) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(s.head_dim), static_cast<cuuint64_t>(seq), static_cast<cuuint64_t>(s.heads),
                              static_cast<cuuint64_t>(s.batch)};
  const cuuint64_t strides[3] = {row_bytes, static_cast<cuuint64_t>(s.head_dim) * sizeof(T), row_bytes * seq};
  return encode_map(map, base, dims, strides, rows);
}

// The additive mask as [key, query, head, batch], a broadcast dimension with extent 1: a box is 64
// keys of `rows` queries. False when TMA cannot read it: keys not contiguous, a base or a query,
// head or batch stride not 16-byte aligned.
template <typename T>
bool make_mask_map(CUtensorMap* map, const T* mask, const MhaShape& s, int rows) {
  const int64_t* ms = s.mask_stride;
  if (!aligned16(mask) || (ms[3] != 1 && s.k_seq != 1)) return false;
  const int64_t extent[3] = {s.q_seq, s.heads, s.batch};
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(s.k_seq), 1, 1, 1}, strides[3];
  for (int i = 0; i < 3; ++i) {
    const int64_t stride = ms[2 - i];
    if (stride % 8 != 0) return false;
    if (stride != 0) dims[i + 1] = static_cast<cuuint64_t>(extent[i]);
    strides[i] = stride != 0 ? static_cast<cuuint64_t>(stride) * sizeof(T) : 16;  // any legal stride for an extent of 1
  }
  return encode_map(map, mask, dims, strides, rows);
}

// DEPLOYFUSE_MHA_PERSISTENT=0 launches a CTA per work item (each then runs one), for benchmarks to
// time what persistence gives.
bool persistent() {
  static const bool on = env_flag("DEPLOYFUSE_MHA_PERSISTENT", true);
  return on;
}

template <typename T, int D, int kConsumers, Sm90Mask kMask, int kCtas>
cudaError_t launch_with(cudaStream_t stream, int device, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& s,
                        MhaYq yq) {
  using Tile = Sm90Tile<D, kConsumers, kMask, kCtas>;
  const auto kernel = fused_mha_sm90_kernel<T, D, kConsumers, kMask, kCtas>;
  static std::atomic<int> resident[64];  // CTAs the GPU runs at once, by device ordinal (0: not yet asked)
  if (device >= 64) return cudaErrorNotSupported;
  int ctas = resident[device].load();
  if (ctas == 0) {
    int per_sm = 0, sms = 0;
    DF_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Tile::kSmem)));
    DF_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Tile::kThreads, Tile::kSmem));
    DF_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (per_sm < 1) return cudaErrorNotSupported;
    ctas = per_sm * sms;
    resident[device].store(ctas);
  }
  CUtensorMap maps[4] = {};
  if (!make_map(&maps[0], q, s, s.q_seq, s.q_ld, Tile::kBlockM) || !make_map(&maps[1], k, s, s.k_seq, s.k_ld, kBlockN) ||
      !make_map(&maps[2], v, s, s.k_seq, s.v_ld, kBlockN) ||
      (kMask != Sm90Mask::kNone && !make_mask_map(&maps[3], mask, s, Tile::kMaskRows))) {
    return cudaErrorNotSupported;
  }
  Sm90Params prm;
  prm.scale = s.scale * kLog2e;
  prm.q_seq = static_cast<int>(s.q_seq);
  prm.k_seq = static_cast<int>(s.k_seq);
  prm.heads = static_cast<int>(s.heads);
  prm.causal = s.causal;
  prm.mask_b = mask && s.mask_stride[0] != 0;
  prm.mask_h = mask && s.mask_stride[1] != 0;
  prm.yq_scale = yq.scale;
  prm.yq = yq.yq;
  const int64_t q_blocks = (s.q_seq + Tile::kBlockM - 1) / Tile::kBlockM, items = q_blocks * s.batch * s.heads;
  if (items > INT_MAX) return cudaErrorNotSupported;
  prm.q_blocks = static_cast<int>(q_blocks);
  prm.items = static_cast<int>(items);
  // Causal items over more than one key tile differ in work (the diagonal's blocks are short): left to
  // the hardware's CTA scheduler, a CTA an item (8 x 2048 causal, 16 heads: 0.211 ms that way, 0.223
  // with narrow persistent CTAs, bench/results/mha_tiles_persistent_h200.log).
  const bool even = !s.causal || s.k_seq <= kBlockN;
  const int64_t grid = persistent() && even ? std::min<int64_t>(items, ctas) : items;
  kernel<<<static_cast<unsigned>(grid), Tile::kThreads, Tile::kSmem, stream>>>(maps[0], maps[1], maps[2], maps[3], y, prm);
  return cudaGetLastError();
}

bool is_sm90(int device) {
  static std::atomic<int> cached[64];  // 0 unknown, 1 yes, 2 no
  if (device >= 64) return false;
  int state = cached[device].load();
  if (state == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    state = major == 9 && minor == 0 ? 1 : 2;
    cached[device].store(state);
  }
  return state == 1;
}

template <typename T, int D, int kConsumers, int kCtas = 1>
cudaError_t launch_mask(cudaStream_t stream, int device, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& s,
                        MhaYq yq) {
  if (!mask) return launch_with<T, D, kConsumers, Sm90Mask::kNone, kCtas>(stream, device, q, k, v, mask, y, s, yq);
  if (s.mask_stride[2] == 0) return launch_with<T, D, kConsumers, Sm90Mask::kRow, kCtas>(stream, device, q, k, v, mask, y, s, yq);
  return launch_with<T, D, kConsumers, Sm90Mask::kTile, kCtas>(stream, device, q, k, v, mask, y, s, yq);
}

// The CTA shape for head_dim 64: "narrow" (one 64-row consumer, two CTAs an SM), "wide" (two consumers)
// or "triple" (three: each K/V tile serves 192 rows). DEPLOYFUSE_MHA_TILE names one, or "sm80" for none
// (the call goes to fused_mha_tc.cu's tensor-core kernel), for benchmarks to compare them. Otherwise keys
// that fit in four tiles get narrow CTAs (H200, bench/results/mha_tiles_h200.log: 0.90x of wide at 128
// keys, 0.70x of triple at ViT's 197, 0.90x of triple at 512), and longer sequences triple (0.86x of
// wide at seq 2048, same log) unless it pads the queries by more than 64 rows over wide.
enum class Sm90Shape { kNarrow, kWide, kTriple, kNone };  // kNone: leave the call to the sm_80 tensor-core kernel

Sm90Shape choose_shape(const MhaShape& s) {
  static const int forced = [] {
    const char* name = std::getenv("DEPLOYFUSE_MHA_TILE");
    if (name == nullptr) return -1;
    if (std::strcmp(name, "narrow") == 0) return static_cast<int>(Sm90Shape::kNarrow);
    if (std::strcmp(name, "wide") == 0) return static_cast<int>(Sm90Shape::kWide);
    if (std::strcmp(name, "triple") == 0) return static_cast<int>(Sm90Shape::kTriple);
    if (std::strcmp(name, "sm80") == 0) return static_cast<int>(Sm90Shape::kNone);
    return -1;
  }();
  if (forced >= 0) return static_cast<Sm90Shape>(forced);
  if (s.k_seq <= 4 * kBlockN) return Sm90Shape::kNarrow;
  const int64_t wide = (s.q_seq + 127) / 128 * 128, triple = (s.q_seq + 191) / 192 * 192;
  return triple - wide <= 64 ? Sm90Shape::kTriple : Sm90Shape::kWide;
}

}  // namespace

template <typename T>
cudaError_t launch_fused_mha_sm90(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& s, MhaYq yq) {
  if (!(s.scale > 0.f) || (s.head_dim != 64 && s.head_dim != 128)) return cudaErrorNotSupported;
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(y) || !aligned16(yq.yq)) return cudaErrorNotSupported;
  if (s.q_seq > INT_MAX - 256 || s.k_seq > INT_MAX - 256 || s.heads > INT_MAX / 256) return cudaErrorNotSupported;
  int device = 0;
  DF_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (!is_sm90(device) || !encode_tiled()) return cudaErrorNotSupported;
  if (s.head_dim == 128) return launch_mask<T, 128, 2>(stream, device, q, k, v, mask, y, s, yq);  // one CTA fills an SM's shared memory
  switch (choose_shape(s)) {
    case Sm90Shape::kNarrow: return launch_mask<T, 64, 1, 2>(stream, device, q, k, v, mask, y, s, yq);
    case Sm90Shape::kTriple: return launch_mask<T, 64, 3>(stream, device, q, k, v, mask, y, s, yq);
    case Sm90Shape::kNone: return cudaErrorNotSupported;
    default: return launch_mask<T, 64, 2>(stream, device, q, k, v, mask, y, s, yq);
  }
}

template cudaError_t launch_fused_mha_sm90<__half>(cudaStream_t, const __half*, const __half*, const __half*, const __half*, __half*, const MhaShape&,
                                                    MhaYq);
template cudaError_t launch_fused_mha_sm90<__nv_bfloat16>(cudaStream_t, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                                           const __nv_bfloat16*, __nv_bfloat16*, const MhaShape&, MhaYq);

}  // namespace deployfuse
