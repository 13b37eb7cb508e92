// Programmatic dependent launch (Hopper and later): a kernel launched by launch_after_previous() may be scheduled while
// the kernel before it on the stream still drains (its last CTAs, its memory flush), instead of after it (stream capture
// records it as a programmatic edge of the CUDA graph, as CUDA's programming guide describes). The kernel must call
// wait_for_previous_grid() before it reads anything and before it writes anything: the previous kernel's outputs are complete only past
// that point, and a buffer the previous kernel still reads may be the one this kernel writes (ONNX Runtime reuses freed buffers). What runs
// before it, barrier setup in shared memory, overlaps the previous kernel's tail.
// Off unless DEPLOYFUSE_PDL=1, and only for code built for sm_90 or later: a benchmark switch until end-to-end runs time it.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "common/arch_check.h"
#include "common/env_flag.h"

namespace deployfuse {

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to start before the previous kernel on the stream ends when
// DEPLOYFUSE_PDL=1 and the code the device runs for `kernel` was compiled for sm_90 or later (`built_for`, the call site's
// cached answer): code compiled for an older architecture (a build for sm_80 JIT-compiled on a Hopper GPU) has no
// griddepcontrol.wait, so it must not start early. Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t launch_after_previous(ArchCheck& built_for, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                  Args&&... args) {
  static const bool asked = env_flag("DEPLOYFUSE_PDL", false);
  if (!asked || !built_for(reinterpret_cast<const void*>(kernel), 90)) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace deployfuse
