// SkipLayerNormFp8 CUDA launcher: per row of cols, sum = x (or x[ids]) [+ skip] + bias, y = LayerNorm(sum) * gamma + beta (fp32
// statistics), yq = e4m3(y / y_scale) with y as rounded to T (saturating, round to nearest even), each output optional.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "skip_layer_norm_fp8/skip_layer_norm_fp8.h"

namespace deployfuse {

// x, y, sum: T [rows, cols]; skip: T [skip_rows, cols], row r reading skip[r % skip_rows] (skip_rows 0: rows); yq: float8e4m3fn
// [rows, cols]; gamma, beta, bias: T [cols]; y_scale: a device float. With ids (int64 [rows]): x is a [table_rows, cols] table and row r
// reads x[table_row(ids[r], table_rows)]. skip, ids, y, yq, sum may be null (absent). T = float, __half or __nv_bfloat16.
template <typename T>
cudaError_t launch_skip_layer_norm_fp8(cudaStream_t stream, const T* x, const T* skip, const T* gamma, const T* beta, const T* bias,
                                       const float* y_scale, T* y, uint8_t* yq, T* sum, int64_t rows, int64_t cols, float epsilon,
                                       const int64_t* ids = nullptr, int64_t table_rows = 0, int64_t skip_rows = 0);

}  // namespace deployfuse
