// Hopper FusedMHA path (fp16/bf16, head_dim 64/128, sm_90a: wgmma + TMA), tried first by
// launch_fused_mha on compute capability 9.0 when the library was built with sm_90a code.
#pragma once
#include <cuda_runtime.h>

#include "common/mha_shape.h"
#include "fused_mha/mha_yq.h"

namespace deployfuse {

// Same contract as launch_fused_mha for T = __half or __nv_bfloat16. Returns cudaErrorNotSupported,
// launching nothing, when this path cannot take the call (not a 9.0 GPU, head_dim not 64/128, a
// negative scale, Q/K/V/Y or their row strides not 16-byte aligned, a mask TMA cannot read — keys not contiguous, strides
// or base not 16-byte aligned —, no cuTensorMapEncodeTiled in the driver); the caller then tries the
// next path.
template <typename T>
cudaError_t launch_fused_mha_sm90(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& shape,
                                  MhaYq yq);

}  // namespace deployfuse
