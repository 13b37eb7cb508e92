// FusedMHA as a TensorRT plugin (see common/trt_plugin.h): Y takes Q's shape, so Q, K, V are
// [batch, seq, hidden]. packed_qkv=1 (Y a third of Q's width) is refused when the plugin is
// created, naming why: the tensorrt target never emits it (packed_mha runs on ort-cuda only).
#pragma once
#include <stdexcept>

#include "common/trt_plugin.h"
#include "fused_mha/fused_mha.cuh"
#include "fused_mha/fused_mha.h"

namespace deployfuse {
namespace trt {

struct FusedMHAOp : FusedMHAAttrs {
  explicit FusedMHAOp(const AttrValues& a) : FusedMHAAttrs(a) {
    if (packed) throw std::invalid_argument("packed_qkv=1 has no TensorRT plugin: give Q, K, V as three [batch, seq, hidden] tensors");
  }
  cudaError_t enqueue(DataType type, const PluginTensorDesc* desc, int32_t nb_in, const void* const* inputs, void* y,
                      cudaStream_t stream) const {
    try {
      const Inputs in = inputs_of(desc, nb_in, inputs);
      const Sizes s = sizes(in);
      return with_dtype(dtype_of(type), [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return run_cuda(*this, s, in, static_cast<T*>(y), stream);
      });
    } catch (const std::exception& e) {
      report(Spec::kName, e.what());
      return cudaErrorInvalidValue;
    }
  }
};

}  // namespace trt
}  // namespace deployfuse
