// FusedMHA as a TensorRT plugin (see common/trt_plugin.h): the generic adapter (Y takes Q's shape, so
// Q, K, V are [batch, seq, hidden]), which refuses packed_qkv=1 (Y a third of Q's width) when the
// plugin is created, naming why: the tensorrt target never emits it (packed_mha runs on ort-cuda only).
// Likewise the YQ form (a YScale input, a float8 second output: fp8_attention_out runs on ort-cuda only),
// refused when it runs: the plugin has one output, so it would never write YQ.
#pragma once
#include <stdexcept>

#include "common/trt_plugin.h"
#include "fused_mha/fused_mha.cuh"
#include "fused_mha/fused_mha.h"

namespace deployfuse {
namespace trt {

struct FusedMHAOp : Adapter<FusedMHAAttrs> {
  explicit FusedMHAOp(const AttrValues& a) : Adapter<FusedMHAAttrs>(a) {
    if (packed) throw std::invalid_argument("packed_qkv=1 has no TensorRT plugin: give Q, K, V as three [batch, seq, hidden] tensors");
  }
  cudaError_t enqueue(DataType type, const PluginTensorDesc* desc, int32_t nb_in, const void* const* inputs, void* y,
                      cudaStream_t stream) const {
    if (nb_in > 4) {
      report(Spec::kName, "YScale (the float8 output YQ) has no TensorRT plugin: give Q, K, V [, Mask] and read Y");
      return cudaErrorInvalidValue;
    }
    return Adapter<FusedMHAAttrs>::enqueue(type, desc, nb_in, inputs, y, stream);
  }
};

}  // namespace trt
}  // namespace deployfuse
