// LayerNormGelu CUDA launcher: Y = GELU((X - mean) / sqrt(var + eps) * scale + bias) per row.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace deployfuse {

// x, y: [rows, cols]; scale, bias: [cols]. T = float, __half or __nv_bfloat16 (fp32 math).
template <typename T>
cudaError_t launch_layer_norm_gelu(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y,
                                   int64_t rows, int64_t cols, float epsilon, bool tanh_approx);

}  // namespace deployfuse
