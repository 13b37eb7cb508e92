// FusedMHA as a TensorRT plugin (see common/trt_plugin.h): the generic adapter (Y takes Q's shape, so
// Q, K, V are [batch, seq, hidden]), which refuses packed_qkv=1 (Y a third of Q's width) when the
// plugin is created, naming why: the tensorrt target never emits it (packed_mha runs on ort-cuda only).
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
};

}  // namespace trt
}  // namespace deployfuse
