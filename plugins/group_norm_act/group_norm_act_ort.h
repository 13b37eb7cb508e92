// GroupNormAct for ONNX Runtime (see common/ort_adapter.h).
#pragma once
#include "common/activation.h"
#include "common/ort_adapter.h"
#include "group_norm_act/group_norm_act.h"
#ifdef DEPLOYFUSE_WITH_CUDA
#include "group_norm_act/group_norm_act.cuh"
#endif

namespace deployfuse {
namespace ort {

struct GroupNormAct : GroupNormActAttrs {
  using GroupNormActAttrs::GroupNormActAttrs;
  void Run(Call& c, bool on_cuda) const {
    auto x = c.ctx.GetInput(0);
    auto dims = x.GetTensorTypeAndShapeInfo().GetShape();
    if (dims.size() < 2) fail(Spec::kName, "X must be [N, C, ...]");
    const int64_t n = dims[0], channels = dims[1], spatial = product(dims, 2, dims.size());
    if (channels % groups != 0) fail(Spec::kName, "channels not divisible by num_groups");
    auto y = c.ctx.GetOutput(0, dims);
    if (!on_cuda) {
      group_norm_act_cpu(x.GetTensorData<float>(), c.ctx.GetInput(1).GetTensorData<float>(), c.ctx.GetInput(2).GetTensorData<float>(),
                         y.GetTensorMutableData<float>(), n, channels, spatial, groups, epsilon, act);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    launch_cuda(Spec::kName, c, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_group_norm_act<T>(static_cast<cudaStream_t>(c.stream), static_cast<const T*>(x.GetTensorRawData()),
                                      static_cast<const T*>(c.ctx.GetInput(1).GetTensorRawData()),
                                      static_cast<const T*>(c.ctx.GetInput(2).GetTensorRawData()),
                                      static_cast<T*>(y.GetTensorMutableRawData()), n, channels, spatial, groups, epsilon, act);
    });
#endif
  }
};

}  // namespace ort
}  // namespace deployfuse
