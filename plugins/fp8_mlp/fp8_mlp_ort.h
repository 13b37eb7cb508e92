// Fp8Mlp for ONNX Runtime (see common/ort_adapter.h): X (or X already in float8e4m3fn, as Fp8GemmAct's), B1, B2 and Y in T, the scales
// float32, W1 and W2 float8e4m3fn; Y is [..., N2]. On the CUDA EP each kernel instance keeps its own cuBLASLt runner (Fp8GemmAct's: the
// plans of FC1 and FC2, each GEMM launched with its own candidate, algo1 and algo2) and takes its scratch (X's float8 copy unless X comes
// in float8, H in float8, 1/HScale, the GEMMs' padded copies) from ONNX Runtime's allocator (CUDA-graph capture safe). An instance whose
// HScale is a constant initializer (the rewrite's static calibration) keeps 1/HScale on the device from its first run
// (Fp8MlpHScaleInverse), so its calls, X in float8 included, launch no reciprocal kernel.
#pragma once

#include "common/ort_adapter.h"
#include "fp8_gemm_act/fp8_gemm_act_ort.h"  // Fp8GemmAct::takes_on_cuda, fp8_gemm_refusal, launch_cublaslt
#include "fp8_mlp/fp8_mlp.h"
#ifdef DEPLOYFUSE_WITH_CUDA
#include <memory>

#include "fp8_mlp/fp8_mlp.cuh"
#endif

namespace deployfuse {
namespace ort {

struct Fp8Mlp : Fp8MlpAttrs {
  static constexpr size_t kHScaleInput = 5;
  // The attributes, and whether the node's HScale is a constant initializer (not overridable by a feed: ONNX Runtime's own test).
  Fp8Mlp(const AttrValues& attrs, const Ort::ConstKernelInfo& info) : Fp8MlpAttrs(attrs) {
    int constant = 0;
    info.GetTensorConstantInput(kHScaleInput, &constant);
#ifdef DEPLOYFUSE_WITH_CUDA
    if (constant) h_scale_inverse = std::make_shared<Fp8MlpHScaleInverse>();
#endif
  }
  static bool takes_on_cuda(ElemType type) { return Fp8GemmAct::takes_on_cuda(type); }  // fp32 nodes run on the CPU EP
  static constexpr bool kTakesFp8X = true;                                              // as Fp8GemmAct's X

  void Run(Call& c, bool on_cuda) const {
    Sizes s;
    const Inputs in = sized_inputs(*this, c, &s);
    auto y = gemm_output(c, in[0], s.n2);
    const bool x_fp8 = fp8_x(c);
    if (!on_cuda) {
      const std::vector<float> xd = x_fp8 ? dequantized(in[0], in[1].as<float>()[0]) : std::vector<float>();
      fp8_mlp_cpu(x_fp8 ? xd.data() : in[0].as<float>(), in[1].as<float>()[0], in[2].as<uint8_t>(), in[3].as<float>()[0],
                  in[4].as_or_null<float>(), in[5].as<float>()[0], in[6].as<uint8_t>(), in[7].as<float>()[0], in[8].as_or_null<float>(),
                  y.GetTensorMutableData<float>(), s, act);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    if (s.n1 % kFp8GemmActKMultiple != 0)
      fail(Spec::kName, "N1 (W1's rows) must be a multiple of 16 on CUDA: the hidden activation is kept in float8 rows of 16 bytes");
    if (x_fp8) check_fp8_x_rows(Spec::kName, s.k);
    const float* h_inverse = nullptr;
    if (h_scale_inverse) {
      const cudaError_t err = h_scale_inverse->get(static_cast<cudaStream_t>(c.stream), in[kHScaleInput].as<float>(), &h_inverse);
      if (err != cudaSuccess) fail(Spec::kName, std::string("CUDA error keeping 1/HScale: ") + cudaGetErrorString(err));
    }
    launch_cublaslt(Spec::kName, c, s.k, [&](auto* tag, GemmActScratch& scratch) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return fp8_gemm_refusal(
          Spec::kName,
          launch_fp8_mlp<T>(*runner, static_cast<cudaStream_t>(c.stream),
                            Fp8MlpProblem{s.m, s.k, s.n1, s.n2, act, fast_accum, algo1, algo2, x_fp8}, in[0].data, in[1].as<float>(),
                            in[2].as<uint8_t>(), in[3].as<float>(), in[4].as_or_null<T>(), in[5].as<float>(), in[6].as<uint8_t>(),
                            in[7].as<float>(), in[8].as_or_null<T>(), static_cast<T*>(y.GetTensorMutableRawData()), scratch, h_inverse));
    });
#endif
  }

#ifdef DEPLOYFUSE_WITH_CUDA
  std::shared_ptr<Fp8GemmActRunner> runner = make_fp8_gemm_act_runner();  // no CUDA call until the first Run
  std::shared_ptr<Fp8MlpHScaleInverse> h_scale_inverse;                   // a constant HScale's; no CUDA call until the first Run
#endif
};

}  // namespace ort
}  // namespace deployfuse
