// Shared-memory addresses as 32-bit shared-window offsets (what PTX's .shared operands take), and
// loads at such addresses, so that a loop's addresses are formed once: through pointers into dynamic
// or cluster-kernel shared memory, nvcc rebuilt them (shared-window base, offsets) for every access.
// The loads are volatile: kept in order with the barriers and mbarrier waits (volatile too) that
// make the data visible.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace deployfuse {

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ float2 ld_shared_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

}  // namespace deployfuse
