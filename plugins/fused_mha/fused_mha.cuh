// FusedMHA CUDA launcher: Y = softmax(Q K^T * scale + mask [+ causal]) V per (batch, head).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "common/mha_shape.h"

namespace deployfuse {

// mask may be null. head_dim <= 256. T = float, __half or __nv_bfloat16 (fp32 math).
template <typename T>
cudaError_t launch_fused_mha(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& shape);

}  // namespace deployfuse
