// GemmAct as a TensorRT plugin (see common/trt_plugin.h): Y is [..., N] (W's second axis), the
// algorithm's workspace is the plugin's (kGemmActWorkspaceBytes through getWorkspaceSize), and a
// plugin and its clones share one cuBLASLt runner (thread-safe), made on the first enqueue.
#pragma once
#include <memory>

#include "common/trt_plugin.h"
#include "gemm_act/gemm_act.cuh"
#include "gemm_act/gemm_act.h"

namespace deployfuse {
namespace trt {

struct GemmActOp : GemmActAttrs {
  using GemmActAttrs::GemmActAttrs;
  static constexpr size_t kWorkspaceBytes = kGemmActWorkspaceBytes;

  static bool output_shape(const nvinfer1::DimsExprs* in, int32_t nb_in, nvinfer1::DimsExprs* out) {
    if (nb_in < 2 || in[0].nbDims < 1 || in[1].nbDims != 2) return false;
    *out = in[0];
    out->d[out->nbDims - 1] = in[1].d[1];
    return true;
  }

  cudaError_t enqueue(DataType type, const PluginTensorDesc* in, int32_t nb_in, const void* const* inputs, void* y, void* workspace,
                      cudaStream_t stream) const {
    const nvinfer1::Dims &xd = in[0].dims, &wd = in[1].dims;
    if (xd.nbDims < 1 || wd.nbDims != 2 || wd.d[0] != xd.d[xd.nbDims - 1] || wd.d[0] == 0) return cudaErrorInvalidValue;
    if (gemm_act_unavailable() != nullptr) {
      report(Spec::kName, gemm_act_unavailable());
      return cudaErrorSharedObjectInitFailed;
    }
    const GemmActProblem p{volume(xd, 0, xd.nbDims - 1), wd.d[1], wd.d[0], act, algo};
    const void* residual = nb_in > 3 ? inputs[3] : nullptr;
    FixedScratch scratch(workspace, kWorkspaceBytes);
    return with_dtype(dtype_of(type), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_gemm_act<T>(*runner, stream, p, static_cast<const T*>(inputs[0]), static_cast<const T*>(inputs[1]),
                                static_cast<const T*>(inputs[2]), static_cast<const T*>(residual), static_cast<T*>(y), scratch);
    });
  }

  std::shared_ptr<GemmActRunner> runner = make_gemm_act_runner();  // no CUDA call until the first enqueue
};

}  // namespace trt
}  // namespace deployfuse
