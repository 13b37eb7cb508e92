// BiasAct as a TensorRT plugin (see common/trt_plugin.h).
#pragma once
#include "bias_act/bias_act.cuh"
#include "bias_act/bias_act.h"
#include "common/activation.h"
#include "common/trt_plugin.h"

namespace deployfuse {
namespace trt {

struct BiasActOp : BiasActAttrs {
  using BiasActAttrs::BiasActAttrs;
  cudaError_t enqueue(DataType type, const PluginTensorDesc* in, int32_t, const void* const* inputs, void* y, cudaStream_t stream) const {
    const nvinfer1::Dims& d = in[0].dims;
    const int64_t total = volume(d, 0, d.nbDims), cols = d.nbDims == 0 ? 1 : d.d[d.nbDims - 1];
    return with_dtype(dtype_of(type), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_bias_act<T>(stream, static_cast<const T*>(inputs[0]), static_cast<const T*>(inputs[1]), static_cast<T*>(y), total, cols,
                                act);
    });
  }
};

}  // namespace trt
}  // namespace deployfuse
