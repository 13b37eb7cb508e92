// Tensor-core FusedMHA path (fp16/bf16, sm_80+), tried first by launch_fused_mha.
#pragma once
#include <cuda_runtime.h>

#include "common/mha_shape.h"
#include "fused_mha/mha_yq.h"

namespace deployfuse {

// Same contract as launch_fused_mha for T = __half or __nv_bfloat16. Returns cudaErrorNotSupported,
// launching nothing, when this path cannot take the call (head_dim not 32/64/96/128, Q/K/V/Y or their
// row strides not 16-byte aligned, a GPU older than sm_80); the caller then falls back to the CUDA-core kernel.
template <typename T>
cudaError_t launch_fused_mha_tc(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& shape,
                                MhaYq yq);

}  // namespace deployfuse
