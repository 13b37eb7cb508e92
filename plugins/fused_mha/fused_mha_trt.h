// FusedMHA as a TensorRT plugin (see common/trt_plugin.h).
#pragma once
#include <cmath>

#include "common/mha_shape.h"
#include "common/trt_plugin.h"
#include "fused_mha/fused_mha.cuh"
#include "fused_mha/fused_mha.h"

namespace deployfuse {
namespace trt {

struct FusedMHAOp : FusedMHAAttrs {
  using FusedMHAAttrs::FusedMHAAttrs;
  cudaError_t enqueue(DataType type, const PluginTensorDesc* in, int32_t nb_in, const void* const* inputs, void* y,
                      cudaStream_t stream) const {
    const nvinfer1::Dims &q = in[0].dims, &k = in[1].dims;
    if (q.nbDims != 3 || k.nbDims != 3 || q.d[2] != k.d[2] || q.d[0] != k.d[0] || q.d[2] % heads != 0) return cudaErrorInvalidValue;
    MhaShape s{q.d[0], q.d[1], k.d[1], heads, q.d[2] / heads, scale, causal, {0, 0, 0, 0}};
    if (s.scale == 0.f) s.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
    const void* mask = nb_in > 3 ? inputs[3] : nullptr;
    if (mask != nullptr && !set_mask_strides(in[3].dims.d, in[3].dims.nbDims, &s)) return cudaErrorInvalidValue;
    return with_dtype(dtype_of(type), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_fused_mha<T>(stream, static_cast<const T*>(inputs[0]), static_cast<const T*>(inputs[1]),
                                 static_cast<const T*>(inputs[2]), static_cast<const T*>(mask), static_cast<T*>(y), s);
    });
  }
};

}  // namespace trt
}  // namespace deployfuse
