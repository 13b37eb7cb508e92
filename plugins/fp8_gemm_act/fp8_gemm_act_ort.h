// Fp8GemmAct for ONNX Runtime (see common/ort_adapter.h): X, Bias and Y in T, XScale and WScale
// float32, W float8e4m3fn (the element types ort_ops.cc registers from the spec's input_types).
// On the CUDA EP each kernel instance keeps its own cuBLASLt runner and takes its scratch (X's float8
// copy, the padded copies where K or N needs them, the algorithm's workspace) from ONNX Runtime's
// allocator, as GemmAct does (CUDA-graph capture safe).
#pragma once

#include "common/ort_adapter.h"
#include "fp8_gemm_act/fp8_gemm_act.h"
#ifdef DEPLOYFUSE_WITH_CUDA
#include <memory>

#include "fp8_gemm_act/fp8_gemm_act.cuh"
#include "gemm_act/gemm_act_ort.h"  // launch_cublaslt
#endif

namespace deployfuse {
namespace ort {

#ifdef DEPLOYFUSE_WITH_CUDA
// A launcher's error, failing with what cuBLASLt's fp8 GEMMs need where they refuse the problem (Fp8GemmAct, Fp8Mlp).
inline cudaError_t fp8_gemm_refusal(const char* op, cudaError_t err) {
  if (err == cudaErrorNotSupported)
    fail(op, "cuBLASLt has no fp8 GEMM for this problem (it needs an sm_89+ GPU, float16/bfloat16 X and 16-byte aligned weights)");
  return err;
}
#endif

struct Fp8GemmAct : Fp8GemmActAttrs {
  using Fp8GemmActAttrs::Fp8GemmActAttrs;
  // cuBLASLt's fp8 kernels write float32 only with a bfloat16 bias: fp32 nodes run on the CPU EP.
  static bool takes_on_cuda(ElemType type) { return type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }

  void Run(Call& c, bool on_cuda) const {
    Sizes s;
    const Inputs in = sized_inputs(*this, c, &s);
    auto y = gemm_output(c, in[0], s.n);
    if (!on_cuda) {
      fp8_gemm_act_cpu(in[0].as<float>(), in[1].as<float>()[0], in[2].as<uint8_t>(), in[3].as<float>()[0], in[4].as<float>(),
                       y.GetTensorMutableData<float>(), s.m, s.n, s.k, act);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    launch_cublaslt(Spec::kName, c, s.k, [&](auto* tag, GemmActScratch& scratch) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return fp8_gemm_refusal(Spec::kName, launch_fp8_gemm_act<T>(*runner, static_cast<cudaStream_t>(c.stream),
                                                                  Fp8GemmActProblem{s.m, s.n, s.k, act, algo, fast_accum}, in[0].as<T>(),
                                                                  in[1].as<float>(), in[2].as<uint8_t>(), in[3].as<float>(), in[4].as<T>(),
                                                                  static_cast<T*>(y.GetTensorMutableRawData()), scratch));
    });
#endif
  }

#ifdef DEPLOYFUSE_WITH_CUDA
  std::shared_ptr<Fp8GemmActRunner> runner = make_fp8_gemm_act_runner();  // no CUDA call until the first Run
#endif
};

}  // namespace ort
}  // namespace deployfuse
