// LayerNormGelu as a TensorRT plugin (see common/trt_plugin.h).
#pragma once
#include "common/trt_plugin.h"
#include "layer_norm_gelu/layer_norm_gelu.cuh"
#include "layer_norm_gelu/layer_norm_gelu.h"

namespace deployfuse {
namespace trt {

struct LayerNormGeluOp : LayerNormGeluAttrs {
  using LayerNormGeluAttrs::LayerNormGeluAttrs;
  cudaError_t enqueue(DataType type, const PluginTensorDesc* in, int32_t, const void* const* inputs, void* y, cudaStream_t stream) const {
    const int32_t rank = in[0].dims.nbDims;
    const int32_t a = static_cast<int32_t>(axis < 0 ? axis + rank : axis);
    if (a < 0 || a >= rank) return cudaErrorInvalidValue;
    const int64_t rows = volume(in[0].dims, 0, a), cols = volume(in[0].dims, a, rank);
    return with_dtype(dtype_of(type), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_layer_norm_gelu<T>(stream, static_cast<const T*>(inputs[0]), static_cast<const T*>(inputs[1]),
                                       static_cast<const T*>(inputs[2]), static_cast<T*>(y), rows, cols, epsilon, tanh_approx);
    });
  }
};

}  // namespace trt
}  // namespace deployfuse
