// FusedMHA for ONNX Runtime (see common/ort_adapter.h): Y shaped by FusedMHAAttrs::y_dims, and the YQ form: a YScale input
// (float32, after a Mask that a node without one names "") and a second output YQ in float8e4m3fn (output_type, which
// ort_ops.cc registers); Y and YQ each optional.
#pragma once
#include <cstdint>
#include <vector>

#include "common/ort_adapter.h"
#include "fused_mha/fused_mha.h"
#ifdef DEPLOYFUSE_WITH_CUDA
#include "fused_mha/fused_mha.cuh"
#endif

namespace deployfuse {
namespace ort {

struct FusedMHA : FusedMHAAttrs {
  using FusedMHAAttrs::FusedMHAAttrs;
  static constexpr size_t kOutputs = 2;  // Y, YQ: both optional
  static ElemType output_type(size_t i, ElemType type) { return i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN : type; }

  void Run(Call& c, bool on_cuda) const {
    Sizes s;
    const Inputs in = sized_inputs(*this, c, &s);  // an absent Mask before a present YScale: in place, without data
    const std::vector<int64_t> dims = y_dims(s);
    void* out[kOutputs] = {};
    for (size_t i = 0; i < kOutputs && i < c.ctx.GetOutputCount(); ++i) {
      auto value = c.ctx.GetOutput(i, dims);
      if (value) out[i] = value.GetTensorMutableRawData();
    }
    const Tensor *m = mask(in), *ys = y_scale(in);
    uint8_t* yq = static_cast<uint8_t*>(out[1]);
    if (yq && !ys) fail(Spec::kName, "YQ needs the YScale input");
    if (!on_cuda) {
      const float scale = ys ? ys->as<float>()[0] : 1.f;
      fused_mha_cpu(qkv<float>(in, 0, s), qkv<float>(in, 1, s), qkv<float>(in, 2, s), m ? m->as<float>() : nullptr,
                    static_cast<float*>(out[0]), s, MhaYq{&scale, yq});
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    if (s.head_dim > 256) fail(Spec::kName, "head_dim > 256 is not supported on CUDA");
    launch_cuda(Spec::kName, c, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_fused_mha<T>(static_cast<cudaStream_t>(c.stream), qkv<T>(in, 0, s), qkv<T>(in, 1, s), qkv<T>(in, 2, s),
                                 m ? m->as<T>() : nullptr, static_cast<T*>(out[0]), s, MhaYq{ys ? ys->as<float>() : nullptr, yq});
    });
#endif
  }
};

}  // namespace ort
}  // namespace deployfuse
