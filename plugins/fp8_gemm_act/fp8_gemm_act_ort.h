// Fp8GemmAct for ONNX Runtime (see common/ort_adapter.h): X, Bias and Y in T, XScale and WScale
// float32, W float8e4m3fn (the element types ort_ops.cc registers from the spec's input_types); registered a second time with
// X in float8e4m3fn, already quantized (kTakesFp8X: no quantize pass).
// On the CUDA EP each kernel instance keeps its own cuBLASLt runner and takes its scratch (X's float8
// copy, the padded copies where K or N needs them; no cuBLASLt workspace) from ONNX Runtime's
// allocator, as GemmAct does (CUDA-graph capture safe).
#pragma once

#include <vector>

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

// Whether the call's X (input 0) is already float8e4m3fn (Fp8GemmAct, Fp8Mlp registered for it too: kTakesFp8X).
inline bool fp8_x(const Call& c) {
  return c.ctx.GetInput(0).GetTensorTypeAndShapeInfo().GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN;
}

// The CPU kernels' X for a float8 X: dq(X, scale) = float(X) · scale, which their q(·, scale) maps back to X exactly.
inline std::vector<float> dequantized(const Tensor& x, float scale) {
  std::vector<float> out(static_cast<size_t>(x.elements()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = e4m3_to_float(x.as<uint8_t>()[i]) * scale;
  return out;
}

// A float8 X on CUDA is the GEMM's operand as it is: its rows must have cuBLASLt's 16 bytes (no padded copy).
inline void check_fp8_x_rows(const char* op, int64_t k) {
  if (k % 16 != 0) fail(op, "a float8 X needs K a multiple of 16 on CUDA (cuBLASLt's fp8 rows of 16 bytes)");
}

struct Fp8GemmAct : Fp8GemmActAttrs {
  using Fp8GemmActAttrs::Fp8GemmActAttrs;
  static constexpr bool kTakesFp8X = true;  // X in T, or already quantized (SkipLayerNormFp8's YQ)
  // cuBLASLt's fp8 kernels write float32 only with a bfloat16 bias: fp32 nodes run on the CPU EP.
  static bool takes_on_cuda(ElemType type) { return type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }

  void Run(Call& c, bool on_cuda) const {
    Sizes s;
    const Inputs in = sized_inputs(*this, c, &s);
    auto y = gemm_output(c, in[0], s.n);
    const bool x_fp8 = fp8_x(c);
    if (!on_cuda) {
      const std::vector<float> xd = x_fp8 ? dequantized(in[0], in[1].as<float>()[0]) : std::vector<float>();
      fp8_gemm_act_cpu(x_fp8 ? xd.data() : in[0].as<float>(), in[1].as<float>()[0], in[2].as<uint8_t>(), in[3].as<float>()[0],
                       in[4].as_or_null<float>(), y.GetTensorMutableData<float>(), s.m, s.n, s.k, act);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    if (x_fp8) check_fp8_x_rows(Spec::kName, s.k);
    launch_cublaslt(Spec::kName, c, s.k, [&](auto* tag, GemmActScratch& scratch) {
      using T = std::remove_pointer_t<decltype(tag)>;
      Fp8GemmActProblem p{s.m, s.n, s.k, act, algo, fast_accum};
      p.x_fp8 = x_fp8;
      return fp8_gemm_refusal(
          Spec::kName,
          launch_fp8_gemm_act<T>(*runner, static_cast<cudaStream_t>(c.stream), p, in[0].data, in[1].as<float>(), in[2].as<uint8_t>(),
                                 in[3].as<float>(), in[4].as_or_null<T>(), static_cast<T*>(y.GetTensorMutableRawData()), scratch));
    });
#endif
  }

#ifdef DEPLOYFUSE_WITH_CUDA
  std::shared_ptr<Fp8GemmActRunner> runner = make_fp8_gemm_act_runner();  // no CUDA call until the first Run
#endif
};

}  // namespace ort
}  // namespace deployfuse
