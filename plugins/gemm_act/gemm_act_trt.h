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

  cudaError_t enqueue(DataType type, const PluginTensorDesc* desc, int32_t nb_in, const void* const* inputs, void* y, void* workspace,
                      cudaStream_t stream) const {
    Inputs in;
    Sizes s;
    try {
      in = inputs_of(desc, nb_in, inputs);
      s = sizes(in);
    } catch (const std::exception& e) {
      report(Spec::kName, e.what());
      return cudaErrorInvalidValue;
    }
    if (s.k == 0) return cudaErrorInvalidValue;
    if (const char* why = gemm_act_unavailable()) {
      report(Spec::kName, why);
      return cudaErrorSharedObjectInitFailed;
    }
    const void* residual = in.count() > 3 ? in[3].data : nullptr;
    FixedScratch scratch(workspace, kWorkspaceBytes);
    return with_dtype(dtype_of(type), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_gemm_act<T>(*runner, stream, GemmActProblem{s.m, s.n, s.k, act, algo}, in[0].as<T>(), in[1].as<T>(), in[2].as<T>(),
                                static_cast<const T*>(residual), static_cast<T*>(y), scratch);
    });
  }

  std::shared_ptr<GemmActRunner> runner = make_gemm_act_runner();  // no CUDA call until the first enqueue
};

}  // namespace trt
}  // namespace deployfuse
