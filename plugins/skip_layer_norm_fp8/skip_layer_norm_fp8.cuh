// SkipLayerNormFp8 CUDA launcher: per row of cols, sum = x [+ skip] + bias, y = LayerNorm(sum) * gamma + beta (fp32 statistics),
// yq = e4m3(y / y_scale) with y as rounded to T (saturating, round to nearest even), each output optional.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "skip_layer_norm_fp8/skip_layer_norm_fp8.h"

namespace deployfuse {

// x, skip, y, sum: T [rows, cols]; yq: float8e4m3fn [rows, cols]; gamma, beta, bias: T [cols]; y_scale: a device float. skip, y, yq,
// sum may be null (absent). T = float, __half or __nv_bfloat16.
template <typename T>
cudaError_t launch_skip_layer_norm_fp8(cudaStream_t stream, const T* x, const T* skip, const T* gamma, const T* beta, const T* bias,
                                       const float* y_scale, T* y, uint8_t* yq, T* sum, int64_t rows, int64_t cols, float epsilon);

}  // namespace deployfuse
