// Tensor-core FusedMHA forward (flash-attention-2 scheme), fp16/bf16 in, fp32 accumulation.
//
// A CTA owns kBlockM = 16 * kWarps query rows of one (batch, head); warp w owns rows 16w..16w+15,
// whose Q fragments it keeps in registers. K and V stream through shared memory kBlockN = 64 keys
// at a time (cp.async; V_j loads while S_j = Q K_j^T is computed, K_j+1 while softmax and P V_j
// run). Per tile and warp:
//   S   = Q K^T                   mma m16n8k16, A = Q (ldmatrix.x4), B = K rows (ldmatrix.x4)
//   x   = S * scale * log2(e) + mask * log2(e), -inf past k_seq and above the causal diagonal
//   m'  = max(m, rowmax x);  P = 2^(x - m');  l = l * 2^(m - m') + rowsum P;  O = O * 2^(m - m')
//   O  += P V                     P re-packed from the S accumulators as the A operand (the m16n8
//                                 C layout of two n-tiles is the m16k16 A layout), B = V via
//                                 ldmatrix.x4.trans
// so S never leaves registers. A thread holds rows lane/4 and lane/4 + 8 of its warp's 16, columns
// 2 * (lane % 4) + {0, 1} of each 8-wide n-tile: row max/sum need only the 4 lanes of a quad.
// Y = O / l (0 where every key was masked, l == 0), staged through shared memory for 16-byte stores.
// Shared rows are padded by 16 bytes: the 8 row addresses of an ldmatrix then hit 8 different bank
// groups (D / 8 + 1 chunks per row is odd).
//
// Additive mask (MaskMode). kTile and kRow stage the mask values of tile j in shared memory, issued
// with V_j so they land during S_j = Q K_j^T, and read them (one 32-bit load per row and n-tile: keys
// 2t, 2t + 1) after the barrier that waits for V_j.
//   kTile: a mask varying over queries, keys contiguous (key stride 1), every row start 16-byte
//          aligned: the CTA's kBlockM rows x 64 keys by cp.async, 16 bytes per 8 keys.
//   kRow:  a mask broadcast over queries (q stride 0, e.g. a [b,1,1,k] padding mask): one row of 64
//          values serves every row of the CTA; by cp.async when key-contiguous and 16-byte aligned,
//          else threads 0-63 load one value each into a register before S_j and store it after.
//   kGlobal: anything else (a q-varying mask that is misaligned or not key-contiguous): each thread
//          reads its 32 values per tile from global memory after the barrier.
// The mask tile's row pitch is 72 elements: the 8 rows g of a warp's 32-bit reads start 4 banks apart.
#include "fused_mha/fused_mha_tc.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "common/arch_check.h"
#include "common/cuda_check.h"
#include "common/dtype.cuh"
#include "common/shared_mem.cuh"
#include "fused_mha/flash_math.cuh"
#include "fused_mha/yq.cuh"

namespace deployfuse {
namespace {

constexpr int kBlockN = 64;


// 16 bytes global -> shared, bypassing L1; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// The first `bytes` (0..16) of 16 bytes global -> shared, the rest zero-filled.
__device__ __forceinline__ void cp_async16_n(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a (16x16, row) * b (16x8, col), fp32 accumulators.
template <typename T> struct Mma;
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <int D>
constexpr int kPitch = D + 8;  // shared row pitch in elements (see the padding note above)
constexpr int kMaskPitch = kBlockN + 8;  // mask tile row pitch in elements (see the header)

enum class MaskMode { kNone, kTile, kRow, kGlobal };

// Rows of the shared mask tile.
template <MaskMode kMode, int kBlockM>
constexpr int kMaskRows = kMode == MaskMode::kTile ? kBlockM : kMode == MaskMode::kRow ? 1 : 0;

// Q/output, K and V tiles, then the mask tile.
template <typename T, int D, int kWarps, MaskMode kMode>
constexpr size_t smem_bytes() {
  return sizeof(T) * ((16 * kWarps + 2 * kBlockN) * kPitch<D> + kMaskRows<kMode, 16 * kWarps> * kMaskPitch);
}

// Rows [r0, r0 + kRows) of a [len, ld] matrix (D columns used) into shared memory; rows past len
// are zero-filled. Commits one cp.async group.
// The tile's start (src + r0 * ld) is CTA-uniform; a thread adds a 32-bit offset (kRows * ld fits in
// int, checked by the launcher), which keeps the per-thread address state small.
template <typename T, int D, int kRows, int kThreads>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int r0, int len, int64_t ld) {
  constexpr int kChunks = D / 8;
  static_assert(kRows * kChunks % kThreads == 0, "whole chunks per thread");
  const T* tile = src + r0 * ld;
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    const int i = threadIdx.x + it * kThreads, r = i / kChunks, c = i % kChunks;
    const bool in = r0 + r < len;
    cp_async16(smem_addr(dst + r * kPitch<D> + c * 8), in ? tile + (r * static_cast<int>(ld) + c * 8) : src, in);
  }
  cp_async_commit();
}

// Mask tile by cp.async (kTile, and kRow with 16-byte aligned contiguous keys). Thread -> chunk c
// (keys 8c .. 8c + 7 of the tile, 16 bytes) of tile rows r, r + kPass, ...: the same keys in every
// pass, so the per-thread state is one pointer and the count of rows before q_seq, set up once.
// Needs key stride 1 and 16-byte aligned row starts (m_base, and ms_q unless kRows == 1).
template <typename T, int kRows, int kThreads>
struct MaskTileLoader {
  static constexpr int kChunks = kBlockN * sizeof(T) / 16;                              // 16-byte chunks per row
  static constexpr int kPass = kThreads / kChunks < kRows ? kThreads / kChunks : kRows;  // rows per pass
  static_assert(kRows % kPass == 0, "whole passes");
  const T* src;  // key 8c of row q0 + r (of row 0 when this thread loads nothing)
  int passes;    // passes p whose row q0 + r + p * kPass < q_seq (0 for threads past kPass rows)

  __device__ __forceinline__ MaskTileLoader(const T* m_base, int q0, int q_seq, int ms_q) {
    const int c = threadIdx.x % kChunks, r = threadIdx.x / kChunks;
    const int left = q_seq - q0 - r;  // rows of this thread's column at or past row r, before q_seq
    passes = r < kPass && left > 0 ? min(kRows / kPass, (left + kPass - 1) / kPass) : 0;
    src = m_base + ((passes > 0 ? (q0 + r) * ms_q : 0) + c * 8);
  }
  // Keys [k0, k0 + kBlockN) into s_m ([kRows][kMaskPitch]); no commit (they join the next committed
  // group). Bytes past k_seq and rows past q_seq are zero-filled (those keys become -inf, those rows
  // are never stored).
  __device__ __forceinline__ void load(T* s_m, int ms_q, int k0, int k_seq) const {
    const int c = threadIdx.x % kChunks, r = threadIdx.x / kChunks, key = k0 + c * 8;
    if (r >= kPass) return;
    const int bytes = key < k_seq ? min(8, k_seq - key) * static_cast<int>(sizeof(T)) : 0;
    const uint32_t dst = smem_addr(s_m + r * kMaskPitch + c * 8);
#pragma unroll
    for (int p = 0; p < kRows / kPass; ++p) {
      const bool in = bytes > 0 && p < passes;
      cp_async16_n(dst + p * kPass * kMaskPitch * static_cast<int>(sizeof(T)), in ? src + (k0 + p * kPass * ms_q) : src, in ? bytes : 0);
    }
  }
};

// Kernel scalars (kept in the constant bank rather than registers).
struct TcParams {
  float scale;     // |scale| * log2(e)
  bool q_negate;   // scale < 0: Q is negated and |scale| used
  bool mask_async; // kRow: the mask row is staged by cp.async (see MaskTileLoader), else by threads 0..63
  const float* yq_scale;  // YQ (MhaYq): YScale on the device; yq null: not written
  uint8_t* yq;
};

// Two 8-warp CTAs per SM (<= 128 registers; 8 warps only run head_dim <= 64).
template <typename T, int D, int kWarps, MaskMode kMode>
__global__ void __launch_bounds__(kWarps * 32, kWarps == 8 ? 2 : 1) fused_mha_tc_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                                   const T* __restrict__ v, const T* __restrict__ mask,
                                                                   T* __restrict__ y, MhaShape s, TcParams prm) {
#if __CUDA_ARCH__ >= 800
  constexpr bool kMask = kMode != MaskMode::kNone;
  constexpr int kBlockM = 16 * kWarps, kThreads = 32 * kWarps, kP = kPitch<D>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* s_q = reinterpret_cast<T*>(smem_raw);  // [kBlockM][kP]; later the output staging area
  T* s_k = s_q + kBlockM * kP;              // [kBlockN][kP]
  T* s_v = s_k + kBlockN * kP;              // [kBlockN][kP]
  T* s_m = s_v + kBlockN * kP;              // kTile: [kBlockM][kMaskPitch]; kRow: [1][kMaskPitch]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t bh = blockIdx.y, b = bh / s.heads, h = bh % s.heads;
  const int q_seq = static_cast<int>(s.q_seq), k_seq = static_cast<int>(s.k_seq);
  const int q0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * kBlockM;  // longest causal blocks start first
  const int qw = q0 + warp * 16;                                           // first row of this warp
  const T* q_base = q + b * s.q_seq * s.q_ld + h * D;
  const T* k_base = k + b * s.k_seq * s.k_ld + h * D;
  const T* v_base = v + b * s.k_seq * s.v_ld + h * D;
  // Mask offsets within one (batch, head) fit in int (checked by the launcher).
  const T* m_base = kMask ? mask + b * s.mask_stride[0] + h * s.mask_stride[1] : nullptr;
  const int ms_q = static_cast<int>(s.mask_stride[2]), ms_k = static_cast<int>(s.mask_stride[3]);
  const int kv_len = s.causal ? min(k_seq, q0 + kBlockM) : k_seq;  // later keys are masked for every row here
  const int n_tiles = (kv_len + kBlockN - 1) / kBlockN;

  // kTile/kRow: the mask tile of keys [k0, k0 + 64) is staged with V's tile (landing while S = Q K^T
  // runs, read after the barrier that waits for V, so the same barriers guard it). stage_mask issues
  // its cp.async (joining the next committed group); kRow without cp.async returns this thread's value
  // (threads 0..63: key k0 + tid), which the caller stores to s_m[tid] before that barrier.
  constexpr bool kMaskSmem = kMode == MaskMode::kTile || kMode == MaskMode::kRow;
  const MaskTileLoader<T, kMode == MaskMode::kTile ? kBlockM : 1, kThreads> mask_loader(m_base, q0, q_seq, kMode == MaskMode::kTile ? ms_q : 0);
  const bool mask_scalar = kMode == MaskMode::kRow && !prm.mask_async && threadIdx.x < kBlockN;
  auto stage_mask = [&](int k0) {
    T val = from_float<T>(0.f);
    if (kMode == MaskMode::kTile || (kMode == MaskMode::kRow && prm.mask_async)) mask_loader.load(s_m, ms_q, k0, k_seq);
    if (mask_scalar && k0 + static_cast<int>(threadIdx.x) < k_seq) val = m_base[(k0 + static_cast<int>(threadIdx.x)) * ms_k];
    return val;
  };

  load_tile<T, D, kBlockM, kThreads>(s_q, q_base, q0, q_seq, s.q_ld);
  if (n_tiles > 0) load_tile<T, D, kBlockN, kThreads>(s_k, k_base, 0, k_seq, s.k_ld);
  cp_async_wait_all();
  __syncthreads();

  // ldmatrix.x4 lane -> row/column offsets. A operand and V^T (trans): matrices (rows 0-7 | 8-15) x
  // (cols 0-7 | 8-15) in column-major order; K as B: (keys 0-7, d 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15).
  const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_col = 8 * (lane >> 4);
  const int k_row = (lane & 7) + 8 * (lane >> 4), k_col = 8 * ((lane >> 3) & 1);

  // A negative scale is taken as -Q with |scale|, so a larger raw score is always a larger logit.
  const float scale = prm.scale;
  const uint32_t q_sign = prm.q_negate ? 0x80008000u : 0u;
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    ldmatrix_x4(qf[kk], smem_addr(s_q + (warp * 16 + a_row) * kP + kk * 16 + a_col));
#pragma unroll
    for (int i = 0; i < 4; ++i) qf[kk][i] ^= q_sign;
  }

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int rows[2] = {qw + g, qw + g + 8};
  const T* m_rows[2] = {m_base, m_base};  // kGlobal: rows past q_seq read row 0 (their outputs are dropped)
  if (kMode == MaskMode::kGlobal) {
#pragma unroll
    for (int r = 0; r < 2; ++r) m_rows[r] += (rows[r] < q_seq ? rows[r] : 0) * ms_q;
  }
  // kTile/kRow: this thread's row g in the mask tile (kTile: row g + 8 is 8 rows on; kRow: the one
  // row serves both), column 2t.
  const T* sm_row = s_m + (kMode == MaskMode::kTile ? (warp * 16 + g) * kMaskPitch : 0) + 2 * t;

  for (int j = 0; j < n_tiles; ++j) {
    const int k0 = j * kBlockN;
    const T m_val = stage_mask(k0);
    load_tile<T, D, kBlockN, kThreads>(s_v, v_base, k0, k_seq, s.v_ld);

    float sc[kBlockN / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kBlockN / 16; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, smem_addr(s_k + (np * 16 + k_row) * kP + kk * 16 + k_col));
        Mma<T>::run(sc[2 * np], qf[kk], kb[0], kb[1]);
        Mma<T>::run(sc[2 * np + 1], qf[kk], kb[2], kb[3]);
      }
    }
    if (mask_scalar) s_m[threadIdx.x] = m_val;
    cp_async_wait_all();
    __syncthreads();  // V_j and the mask tile have landed; every warp is done with K_j
    if (j + 1 < n_tiles) load_tile<T, D, kBlockN, kThreads>(s_k, k_base, k0 + kBlockN, k_seq, s.k_ld);

    // Mask, online softmax. Only the last tile and tiles crossing the diagonal need the
    // bounds/causal test (warp-uniform). Without a mask sc stays raw and the scale is folded into
    // the exponent's FFMA (mul); with one sc becomes the logit in log2 units (mul = 1).
    const bool edge = k0 + kBlockN > k_seq || (s.causal && k0 + kBlockN - 1 > qw);
    const float mul = kMask ? 1.f : scale;
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) {
      float2 mv[2];  // kTile/kRow: keys 2t, 2t + 1 of rows g, g + 8 (0 past k_seq: those become -inf below)
      if (kMaskSmem) {
        mv[0] = unpack2<T>(*reinterpret_cast<const uint32_t*>(sm_row + n * 8));
        mv[1] = kMode == MaskMode::kTile ? unpack2<T>(*reinterpret_cast<const uint32_t*>(sm_row + 8 * kMaskPitch + n * 8)) : mv[0];
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * t + (e & 1), row = rows[e >> 1];
        float x = sc[n][e];
        if (kMaskSmem) {
          x = fmaf((e & 1) ? mv[e >> 1].y : mv[e >> 1].x, kLog2e, x * scale);
        } else if (kMode == MaskMode::kGlobal) {
          x *= scale;
          if (key < k_seq) x = fmaf(to_float(m_rows[e >> 1][key * ms_k]), kLog2e, x);
        }
        if (edge && (key >= k_seq || (s.causal && key > row))) x = -INFINITY;
        sc[n][e] = x;
      }
    }
    float (&s_flat)[kBlockN / 2] = reinterpret_cast<float(&)[kBlockN / 2]>(sc);  // the same registers, flat (flash_math.cuh)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float alpha = online_softmax_row(s_flat, r, mul, m[r], l[r]);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
    }

#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t pa[4];
      p_fragment<T>(s_flat, kk, pa);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, smem_addr(s_v + (kk * 16 + a_row) * kP + dp * 16 + a_col));
        Mma<T>::run(o[2 * dp], pa, vb[0], vb[1]);
        Mma<T>::run(o[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
    cp_async_wait_all();
    __syncthreads();  // K_j+1 has landed; every warp is done with V_j and the mask tile
  }

  // Epilogue: each warp stages its own 16 rows in s_q (only it ever read them), then stores rows.
  T* so = s_q + warp * 16 * kP;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float inv = row_inverse_sum(l[r]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(so + (g + 8 * r) * kP + n * 8 + 2 * t) = pack2<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
  }
  __syncwarp();
  const int64_t ld = s.heads * D;  // Y's (and YQ's) row
  const int64_t base = b * s.q_seq * ld + h * D;
  const E4m3Divisor yq_scale(prm.yq ? *prm.yq_scale : 1.f);
#pragma unroll
  for (int it = 0; it < D / 16; ++it) {  // 16 rows x D / 8 chunks over 32 lanes
    const int i = lane + it * 32, r = i / (D / 8), c = i % (D / 8);
    if (qw + r >= q_seq) continue;
    const uint4 chunk = *reinterpret_cast<const uint4*>(so + r * kP + c * 8);
    const int64_t at = base + (qw + r) * ld + c * 8;
    if (y) *reinterpret_cast<uint4*>(y + at) = chunk;
    if (prm.yq) {  // the 8 values as rounded to T, 8 float8 bytes
      const T* e = reinterpret_cast<const T*>(&chunk);
      uint2 bytes;
      uint16_t* pairs = reinterpret_cast<uint16_t*>(&bytes);
#pragma unroll
      for (int j = 0; j < 4; ++j) pairs[j] = e4m3_pair(e[2 * j], e[2 * j + 1], yq_scale);
      *reinterpret_cast<uint2*>(prm.yq + at) = bytes;
    }
  }
#else
  __trap();  // launch_fused_mha_tc only launches on sm_80+
#endif
}

template <typename T, int D, int kWarps, MaskMode kMode>
cudaError_t launch_with(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& s, MhaYq yq,
                        bool mask_async) {
  constexpr int kBlockM = 16 * kWarps;
  constexpr size_t smem = smem_bytes<T, D, kWarps, kMode>();
  const auto kernel = fused_mha_tc_kernel<T, D, kWarps, kMode>;
  if (smem > 48 * 1024) {
    DF_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  const dim3 grid(static_cast<unsigned>((s.q_seq + kBlockM - 1) / kBlockM), static_cast<unsigned>(s.batch * s.heads));
  TcParams prm;
  prm.scale = fabsf(s.scale) * kLog2e;
  prm.q_negate = s.scale < 0.f;
  prm.mask_async = mask_async;
  prm.yq_scale = yq.scale;
  prm.yq = yq.yq;
  kernel<<<grid, kWarps * 32, smem, stream>>>(q, k, v, mask, y, s, prm);
  return cudaGetLastError();
}

template <typename T, int D, int kWarps>
cudaError_t launch_mode(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& s, MhaYq yq) {
  if (!mask) return launch_with<T, D, kWarps, MaskMode::kNone>(stream, q, k, v, mask, y, s, yq, false);
  // cp.async staging: keys contiguous and every row start (b, h, q offsets) 16-byte aligned.
  const int64_t* ms = s.mask_stride;
  const bool mask_async = ms[3] == 1 && aligned16(mask) && ms[0] % 8 == 0 && ms[1] % 8 == 0 && ms[2] % 8 == 0;
  if (ms[2] == 0) return launch_with<T, D, kWarps, MaskMode::kRow>(stream, q, k, v, mask, y, s, yq, mask_async);
  if (mask_async) return launch_with<T, D, kWarps, MaskMode::kTile>(stream, q, k, v, mask, y, s, yq, true);
  return launch_with<T, D, kWarps, MaskMode::kGlobal>(stream, q, k, v, mask, y, s, yq, false);
}

// 8 warps (128 rows) halve the K/V traffic per query: 1.25x faster at head_dim 64 on an H200. 4 warps
// waste fewer rows on short queries, and at head_dim > 64 (~240 registers) they let two CTAs share an
// SM: 6% faster at head_dim 128.
template <typename T, int D>
cudaError_t launch_dim(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& s, MhaYq yq) {
  if constexpr (D <= 64) {
    if (s.q_seq > 64) return launch_mode<T, D, 8>(stream, q, k, v, mask, y, s, yq);
  }
  return launch_mode<T, D, 4>(stream, q, k, v, mask, y, s, yq);
}

}  // namespace

template <typename T>
cudaError_t launch_fused_mha_tc(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& s, MhaYq yq) {
  // 16-byte aligned bases and row strides suffice: head_dim % 16 == 0 keeps every head offset aligned (YQ's 8-byte stores too).
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(y) || !aligned16(yq.yq)) return cudaErrorNotSupported;
  if (s.q_ld % 8 != 0 || s.k_ld % 8 != 0 || s.v_ld % 8 != 0) return cudaErrorNotSupported;
  if (s.q_seq > INT_MAX - 128 || s.k_seq > INT_MAX - 128) return cudaErrorNotSupported;
  const int64_t max_ld = std::max({s.q_ld, s.k_ld, s.v_ld, s.hidden()});
  if (max_ld > INT_MAX / 256) return cudaErrorNotSupported;  // load_tile's 32-bit row offsets
  if (mask && (s.q_seq - 1) * s.mask_stride[2] + (s.k_seq - 1) * s.mask_stride[3] > INT_MAX) return cudaErrorNotSupported;
  int device = 0, major = 0;
  DF_RETURN_IF_ERROR(cudaGetDevice(&device));
  DF_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  static ArchCheck built_for;
  if (major < 8 || !built_for(reinterpret_cast<const void*>(fused_mha_tc_kernel<T, 64, 4, MaskMode::kNone>), 80)) return cudaErrorNotSupported;
  switch (s.head_dim) {
    case 32: return launch_dim<T, 32>(stream, q, k, v, mask, y, s, yq);
    case 64: return launch_dim<T, 64>(stream, q, k, v, mask, y, s, yq);
    case 96: return launch_dim<T, 96>(stream, q, k, v, mask, y, s, yq);
    case 128: return launch_dim<T, 128>(stream, q, k, v, mask, y, s, yq);
    default: return cudaErrorNotSupported;
  }
}

template cudaError_t launch_fused_mha_tc<__half>(cudaStream_t, const __half*, const __half*, const __half*, const __half*, __half*, const MhaShape&,
                                                  MhaYq);
template cudaError_t launch_fused_mha_tc<__nv_bfloat16>(cudaStream_t, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                                         const __nv_bfloat16*, __nv_bfloat16*, const MhaShape&, MhaYq);

}  // namespace deployfuse
