// SkipLayerNormFp8 for ONNX Runtime (see common/ort_adapter.h): three outputs, each optional (a node may leave any out), Y and Sum in T
// and YQ in float8e4m3fn (output_type, which ort_ops.cc registers), shaped as Sizes::dims (with Ids: Ids' dims and H); X, Skip, Gamma,
// Beta and Bias in T, YScale float32, Ids int64.
#pragma once

#include "common/ort_adapter.h"
#include "skip_layer_norm_fp8/skip_layer_norm_fp8.h"
#ifdef DEPLOYFUSE_WITH_CUDA
#include "skip_layer_norm_fp8/skip_layer_norm_fp8.cuh"
#endif

namespace deployfuse {
namespace ort {

struct SkipLayerNormFp8 : SkipLayerNormFp8Attrs {
  using SkipLayerNormFp8Attrs::SkipLayerNormFp8Attrs;
  static constexpr size_t kOutputs = 3;  // Y, YQ, Sum: all optional
  static ElemType output_type(size_t i, ElemType type) { return i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN : type; }

  void Run(Call& c, bool on_cuda) const {
    Sizes s;
    const Inputs in = sized_inputs(*this, c, &s);
    const std::vector<int64_t> dims(s.dims, s.dims + s.rank);
    void* out[kOutputs] = {};
    for (size_t i = 0; i < kOutputs && i < c.ctx.GetOutputCount(); ++i) {
      auto value = c.ctx.GetOutput(i, dims);
      if (value) out[i] = value.GetTensorMutableRawData();
    }
    const Tensor* skip = s.skip ? &in[5] : nullptr;
    const int64_t* ids = s.ids ? in[6].as<int64_t>() : nullptr;
    if (!on_cuda) {
      skip_layer_norm_fp8_cpu(in[0].as<float>(), skip ? skip->as<float>() : nullptr, ids, in[1].as<float>(), in[2].as<float>(),
                              in[3].as<float>(), in[4].as<float>()[0], static_cast<float*>(out[0]), static_cast<uint8_t*>(out[1]),
                              static_cast<float*>(out[2]), s.rows, s.cols, s.skip_rows, s.table_rows, epsilon);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    launch_cuda(Spec::kName, c, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_skip_layer_norm_fp8<T>(static_cast<cudaStream_t>(c.stream), in[0].as<T>(), skip ? skip->as<T>() : nullptr,
                                           in[1].as<T>(), in[2].as<T>(), in[3].as<T>(), in[4].as<float>(), static_cast<T*>(out[0]),
                                           static_cast<uint8_t*>(out[1]), static_cast<T*>(out[2]), s.rows, s.cols, epsilon, ids,
                                           s.table_rows, s.skip_rows);
    });
#endif
  }
};

}  // namespace ort
}  // namespace deployfuse
