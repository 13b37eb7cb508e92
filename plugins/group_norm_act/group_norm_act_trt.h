// GroupNormAct as a TensorRT plugin (see common/trt_plugin.h).
#pragma once
#include "common/activation.h"
#include "common/trt_plugin.h"
#include "group_norm_act/group_norm_act.cuh"
#include "group_norm_act/group_norm_act.h"

namespace deployfuse {
namespace trt {

struct GroupNormActOp : GroupNormActAttrs {
  using GroupNormActAttrs::GroupNormActAttrs;
  cudaError_t enqueue(DataType type, const PluginTensorDesc* in, int32_t, const void* const* inputs, void* y, cudaStream_t stream) const {
    const nvinfer1::Dims& d = in[0].dims;
    if (d.nbDims < 2 || d.d[1] % groups != 0) return cudaErrorInvalidValue;
    return with_dtype(dtype_of(type), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_group_norm_act<T>(stream, static_cast<const T*>(inputs[0]), static_cast<const T*>(inputs[1]),
                                      static_cast<const T*>(inputs[2]), static_cast<T*>(y), d.d[0], d.d[1], volume(d, 2, d.nbDims), groups,
                                      epsilon, act);
    });
  }
};

}  // namespace trt
}  // namespace deployfuse
