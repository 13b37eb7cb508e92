// FusedMHA for ONNX Runtime (see common/ort_adapter.h).
#pragma once
#include <cmath>

#include "common/mha_shape.h"
#include "common/ort_adapter.h"
#include "fused_mha/fused_mha.h"
#ifdef DEPLOYFUSE_WITH_CUDA
#include "fused_mha/fused_mha.cuh"
#endif

namespace deployfuse {
namespace ort {

struct FusedMHA : FusedMHAAttrs {
  using FusedMHAAttrs::FusedMHAAttrs;
  void Run(Call& c, bool on_cuda) const {
    auto q = c.ctx.GetInput(0), k = c.ctx.GetInput(1), v = c.ctx.GetInput(2);
    auto qd = q.GetTensorTypeAndShapeInfo().GetShape(), kd = k.GetTensorTypeAndShapeInfo().GetShape();
    if (qd.size() != 3 || kd.size() != 3 || v.GetTensorTypeAndShapeInfo().GetShape() != kd || kd[2] != qd[2] || kd[0] != qd[0])
      fail(Spec::kName, "Q, K, V must be [batch, seq, heads*head_dim] with equal hidden sizes");
    if (qd[2] % heads != 0) fail(Spec::kName, "hidden size not divisible by num_heads");
    MhaShape s{qd[0], qd[1], kd[1], heads, qd[2] / heads, scale, causal, {0, 0, 0, 0}};
    if (s.scale == 0.f) s.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
    const void* mask = nullptr;
    if (c.ctx.GetInputCount() > 3) {
      auto m = c.ctx.GetInput(3);
      if (m) {
        auto md = m.GetTensorTypeAndShapeInfo().GetShape();
        if (!set_mask_strides(md.data(), static_cast<int>(md.size()), &s))
          fail(Spec::kName, "Mask is not broadcastable to [batch, heads, q_seq, k_seq]");
        mask = m.GetTensorRawData();
      }
    }
    auto y = c.ctx.GetOutput(0, qd);
    if (!on_cuda) {
      fused_mha_cpu(q.GetTensorData<float>(), k.GetTensorData<float>(), v.GetTensorData<float>(), static_cast<const float*>(mask),
                    y.GetTensorMutableData<float>(), s);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    if (s.head_dim > 256) fail(Spec::kName, "head_dim > 256 is not supported on CUDA");
    launch_cuda(Spec::kName, c, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_fused_mha<T>(static_cast<cudaStream_t>(c.stream), static_cast<const T*>(q.GetTensorRawData()),
                                 static_cast<const T*>(k.GetTensorRawData()), static_cast<const T*>(v.GetTensorRawData()),
                                 static_cast<const T*>(mask), static_cast<T*>(y.GetTensorMutableRawData()), s);
    });
#endif
  }
};

}  // namespace ort
}  // namespace deployfuse
