// FusedMHA for ONNX Runtime (see common/ort_adapter.h): Y is [batch, q_seq, hidden], which is not
// Q's shape when packed_qkv makes Q [batch, q_seq, 3*hidden]; Q, K and V are read in place (their
// thirds of the packed rows, FusedMHAAttrs::qkv).
#pragma once
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
  void Run(Call& c, bool on_cuda) const {
    Sizes s;
    const Inputs in = sized_inputs(*this, c, &s);
    auto y = c.ctx.GetOutput(0, std::vector<int64_t>{s.batch, s.q_seq, s.hidden()});
    if (!on_cuda) {
      run_cpu(*this, s, in, y.GetTensorMutableData<float>());
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    if (s.head_dim > 256) fail(Spec::kName, "head_dim > 256 is not supported on CUDA");
    launch_cuda(Spec::kName, c, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_fused_mha<T>(static_cast<cudaStream_t>(c.stream), qkv<T>(in, 0, s), qkv<T>(in, 1, s), qkv<T>(in, 2, s),
                                 in.count() > 3 ? in[3].as<T>() : nullptr, static_cast<T*>(y.GetTensorMutableRawData()), s);
    });
#endif
  }
};

}  // namespace ort
}  // namespace deployfuse
