// Hopper (sm_90a) warpgroup MMA and its shared-memory descriptors, as inline PTX. Only compiled into
// the sm_90a kernels (fused_mha_sm90.cu).
//
// wgmma D (64 x N, fp32) += A (64 x 16) * B (16 x N) per warpgroup (4 warps, 128 threads). D is N/2
// registers a thread: element (row, col) of warp w of the group, lane = 4 g + t, sits in
// d[4 (col / 8) + 2 (row / 8 % 2) + col % 2] for row = 16 w + g (+ 8), col = 8 i + 2 t (+ 1): the
// mma.sync m16n8 accumulator layout, repeated over N / 8 column tiles. An A operand from registers
// (the "RS" form) takes that layout's m16k16 fragment, four 32-bit registers of two 16-bit values.
//
// Shared operands use the 128-byte swizzle: a tile is stored as column blocks of 64 16-bit values
// (128 bytes a row), each block rows x 128 bytes, 1024-byte aligned, and the 16-byte chunk c of row r
// at chunk c ^ (r % 8) — what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B. Descriptor strides:
//   K-major (the 16 summed values contiguous: Q and K): 8-row groups 1024 bytes apart (SBO); the
//     k-th step of 16 values starts at column block k / 4, byte 32 (k % 4) of its first row.
//   MN-major (V as the B of P V, transposed): 8-row (key) groups 1024 bytes apart (SBO), column
//     blocks of N LBO bytes apart; the k-th step of 16 keys starts 16 rows (2048 bytes) on.
#pragma once
#include <cstdint>

namespace deployfuse {
namespace sm90 {

// Shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>(1024 >> 4) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// Moves registers between warpgroups: every warp of a warpgroup sets its own per-thread limit.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#define DF_D32                                                                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, " \
  "%27, %28, %29, %30, %31}"
#define DF_D64                                                                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, " \
  "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, "   \
  "%52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define DF_F4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define DF_F16(d, i) DF_F4(d, i), DF_F4(d, i + 4), DF_F4(d, i + 8), DF_F4(d, i + 12)
#define DF_F32(d, i) DF_F16(d, i), DF_F16(d, i + 16)
#define DF_F64(d) DF_F32(d, 0), DF_F32(d, 32)

// d (+)= A * B, A and B K-major in shared memory; accumulate = false overwrites d. TY: "f16" / "bf16".
#define DF_WGMMA_SS(N, REGS, OPS, DA, DB, SD, TY)                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SD ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY \
               "." TY " " REGS ", " DA ", " DB ", p, 1, 1, 0, 0;\n}\n"                                           \
               : OPS                                                                                           \
               : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)))
// d += A * B, A from registers (m16k16 fragments), B MN-major (transposed) in shared memory.
#define DF_WGMMA_RS_T(N, REGS, OPS, A0, DB, SD, TY)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SD ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY \
               "." TY " " REGS ", " A0 ", " DB ", p, 1, 1, 1;\n}\n"                                              \
               : OPS                                                                                           \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))

template <bool kBf16>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t da, uint64_t db, bool accumulate) {
  if constexpr (kBf16) DF_WGMMA_SS(64, DF_D32, DF_F32(d, 0), "%32", "%33", "%34", "bf16");
  else DF_WGMMA_SS(64, DF_D32, DF_F32(d, 0), "%32", "%33", "%34", "f16");
}
template <bool kBf16>
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, bool accumulate) {
  if constexpr (kBf16) DF_WGMMA_SS(128, DF_D64, DF_F64(d), "%64", "%65", "%66", "bf16");
  else DF_WGMMA_SS(128, DF_D64, DF_F64(d), "%64", "%65", "%66", "f16");
}
template <bool kBf16>
__device__ __forceinline__ void wgmma_rs_t(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (kBf16) DF_WGMMA_RS_T(64, DF_D32, DF_F32(d, 0), "{%32, %33, %34, %35}", "%36", "%37", "bf16");
  else DF_WGMMA_RS_T(64, DF_D32, DF_F32(d, 0), "{%32, %33, %34, %35}", "%36", "%37", "f16");
}
template <bool kBf16>
__device__ __forceinline__ void wgmma_rs_t(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (kBf16) DF_WGMMA_RS_T(128, DF_D64, DF_F64(d), "{%64, %65, %66, %67}", "%68", "%69", "bf16");
  else DF_WGMMA_RS_T(128, DF_D64, DF_F64(d), "{%64, %65, %66, %67}", "%68", "%69", "f16");
}

#undef DF_WGMMA_RS_T
#undef DF_WGMMA_SS
#undef DF_F64
#undef DF_F32
#undef DF_F16
#undef DF_F4
#undef DF_D64
#undef DF_D32

}  // namespace sm90
}  // namespace deployfuse
