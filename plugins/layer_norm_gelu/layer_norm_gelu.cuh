// LayerNormGelu CUDA launcher: Y = GELU((X - mean) / sqrt(var + eps) * scale + bias) per row.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "layer_norm_gelu/layer_norm_gelu.h"

namespace deployfuse {

// x, y: [rows, cols]; scale, bias: [cols]. T = float, __half or __nv_bfloat16 (fp32 math).
template <typename T>
cudaError_t launch_layer_norm_gelu(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t rows, int64_t cols,
                                   float epsilon, bool tanh_approx);

template <typename T>
cudaError_t run_cuda(const LayerNormGeluAttrs& a, const LayerNormGeluAttrs::Sizes& s, const Inputs& in, T* y, cudaStream_t stream) {
  return launch_layer_norm_gelu<T>(stream, in[0].as<T>(), in[1].as<T>(), in[2].as<T>(), y, s.rows, s.cols, a.epsilon, a.tanh_approx);
}

}  // namespace deployfuse
