// BiasAct for ONNX Runtime (see common/ort_adapter.h).
#pragma once
#include "bias_act/bias_act.h"
#include "common/activation.h"
#include "common/ort_adapter.h"
#ifdef DEPLOYFUSE_WITH_CUDA
#include "bias_act/bias_act.cuh"
#endif

namespace deployfuse {
namespace ort {

struct BiasAct : BiasActAttrs {
  using BiasActAttrs::BiasActAttrs;
  void Run(Call& c, bool on_cuda) const {
    auto x = c.ctx.GetInput(0);
    auto dims = x.GetTensorTypeAndShapeInfo().GetShape();
    const int64_t total = product(dims, 0, dims.size()), cols = dims.empty() ? 1 : dims.back();
    if (c.ctx.GetInput(1).GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(cols))
      fail(Spec::kName, "Bias must have the size of X's last axis");
    auto y = c.ctx.GetOutput(0, dims);
    if (!on_cuda) {
      bias_act_cpu(x.GetTensorData<float>(), c.ctx.GetInput(1).GetTensorData<float>(), y.GetTensorMutableData<float>(), total, cols, act);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    launch_cuda(Spec::kName, c, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_bias_act<T>(static_cast<cudaStream_t>(c.stream), static_cast<const T*>(x.GetTensorRawData()),
                                static_cast<const T*>(c.ctx.GetInput(1).GetTensorRawData()), static_cast<T*>(y.GetTensorMutableRawData()),
                                total, cols, act);
    });
#endif
  }
};

}  // namespace ort
}  // namespace deployfuse
