// LayerNormGelu for ONNX Runtime (see common/ort_adapter.h).
#pragma once
#include "common/ort_adapter.h"
#include "layer_norm_gelu/layer_norm_gelu.h"
#ifdef DEPLOYFUSE_WITH_CUDA
#include "layer_norm_gelu/layer_norm_gelu.cuh"
#endif

namespace deployfuse {
namespace ort {

struct LayerNormGelu : LayerNormGeluAttrs {
  using LayerNormGeluAttrs::LayerNormGeluAttrs;
  void Run(Call& c, bool on_cuda) const {
    auto x = c.ctx.GetInput(0);
    auto dims = x.GetTensorTypeAndShapeInfo().GetShape();
    const int64_t rank = static_cast<int64_t>(dims.size()), a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank) fail(Spec::kName, "axis out of range");
    const int64_t rows = product(dims, 0, a), cols = product(dims, a, dims.size());
    if (c.ctx.GetInput(1).GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(cols) ||
        c.ctx.GetInput(2).GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(cols))
      fail(Spec::kName, "Scale and Bias must have the size of the normalised dims");
    auto y = c.ctx.GetOutput(0, dims);
    if (!on_cuda) {
      layer_norm_gelu_cpu(x.GetTensorData<float>(), c.ctx.GetInput(1).GetTensorData<float>(), c.ctx.GetInput(2).GetTensorData<float>(),
                          y.GetTensorMutableData<float>(), rows, cols, epsilon, tanh_approx);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    launch_cuda(Spec::kName, c, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_layer_norm_gelu<T>(static_cast<cudaStream_t>(c.stream), static_cast<const T*>(x.GetTensorRawData()),
                                       static_cast<const T*>(c.ctx.GetInput(1).GetTensorRawData()),
                                       static_cast<const T*>(c.ctx.GetInput(2).GetTensorRawData()),
                                       static_cast<T*>(y.GetTensorMutableRawData()), rows, cols, epsilon, tanh_approx);
    });
#endif
  }
};

}  // namespace ort
}  // namespace deployfuse
