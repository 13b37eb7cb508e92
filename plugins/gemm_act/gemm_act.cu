// GemmAct on cuBLASLt, the activation in the epilogue (bias, bias+ReLU, bias+tanh-GELU). Row-major Y = X W is column-major Yᵀ = Wᵀ Xᵀ, so
// cuBLASLt gets A = W (n x k, ld n), B = X (k x m, ld k), D = Y (n x m, ld n): the bias then runs along D's rows, as cuBLASLt's bias
// epilogue wants it, and nothing is transposed. A residual is C with beta = 1. fp32 computes in TF32 (what ONNX Runtime's CUDA EP and
// TensorRT do by default), fp16/bf16 in fp32.
//
// cuBLASLt is opened with dlopen on first use (common/cublaslt.cuh, shared with Fp8GemmAct).
#include <tuple>

#include "common/cublaslt.cuh"
#include "common/dtype_dispatch.h"
#include "gemm_act/gemm_act.cuh"

namespace deployfuse {
namespace {

using Plan = cublaslt::Plan<kGemmActCandidates>;
// dtype, m, n, k, epilogue, residual?, alignments of X, W, Bias, C, Y
using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int, bool, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;

}  // namespace

class GemmActRunner {
 public:
  // The plan of the problem (made on first use); null with *err set when there is none.
  template <typename T>
  const Plan* plan(const GemmActProblem& p, const T* x, const T* w, const T* bias, const T* residual, const T* y, cudaError_t* err) {
    cublasLtEpilogue_t epi;
    if (!cublaslt::epilogue(p.act, true, &epi)) {
      *err = cudaErrorInvalidValue;
      return nullptr;
    }
    const void* c = residual ? residual : y;
    const uint32_t aligns[4] = {cublaslt::alignment(w), cublaslt::alignment(x), cublaslt::alignment(c), cublaslt::alignment(y)};
    const cudaDataType_t type = cublaslt::data_type<T>();
    const PlanKey key{static_cast<int>(type),    p.m,       p.n,      p.k, static_cast<int>(epi), residual != nullptr, aligns[1], aligns[0],
                      cublaslt::alignment(bias), aligns[2], aligns[3]};
    return plans_.find(
        key,
        [&](Plan& plan, cublasLtHandle_t handle) {
          const cublasComputeType_t compute = type == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
          return plan.create(compute, {type, p.n, p.k, p.n}, {type, p.k, p.m, p.k}, {type, p.n, p.m, p.n}) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias) && plan.query(handle, kGemmActWorkspaceBytes, aligns);
        },
        p.algo, err);
  }

  template <typename T>
  cudaError_t launch(cudaStream_t stream, const GemmActProblem& p, const T* x, const T* w, const T* bias, const T* residual, T* y,
                     GemmActScratch& scratch) {
    if (p.m == 0 || p.n == 0) return cudaSuccess;
    const auto plan_of = [&](cudaError_t* err) { return plan(p, x, w, bias, residual, y, err); };
    return plans_.with_plan(plan_of, [&](const Plan& plan) {
      const size_t bytes = plan.candidate(p.algo).workspaceSize;
      void* workspace = bytes ? scratch.get(bytes) : nullptr;
      if (bytes && workspace == nullptr) return cudaErrorMemoryAllocation;
      if (!cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias)) return cudaErrorInvalidValue;  // this call's
      return plan.matmul(plans_.handle(), p.algo, w, x, residual ? 1.f : 0.f, residual ? residual : y, y, workspace, stream);
    });
  }

  template <typename T>
  int candidates(const GemmActProblem& p, const T* x, const T* w, const T* bias, const T* residual, const T* y) {
    GemmActProblem all = p;
    all.algo = cublaslt::kAllCandidates;
    return plans_.candidates([&](cudaError_t* err) { return plan(all, x, w, bias, residual, y, err); });
  }

 private:
  cublaslt::Plans<PlanKey, Plan> plans_;
};

std::shared_ptr<GemmActRunner> make_gemm_act_runner() { return std::make_shared<GemmActRunner>(); }

const char* gemm_act_unavailable() {
  const std::string& error = cublaslt::library().error;
  return error.empty() ? nullptr : error.c_str();
}

template <typename T>
cudaError_t launch_gemm_act(GemmActRunner& runner, cudaStream_t stream, const GemmActProblem& p, const T* x, const T* w, const T* bias,
                            const T* residual, T* y, GemmActScratch& scratch) {
  return runner.launch(stream, p, x, w, bias, residual, y, scratch);
}

template <typename T>
int gemm_act_candidates(GemmActRunner& runner, const GemmActProblem& p, const T* x, const T* w, const T* bias, const T* residual,
                        const T* y) {
  return runner.candidates(p, x, w, bias, residual, y);
}

#define DF_INSTANTIATE(T)                                                                                                                  \
  template cudaError_t launch_gemm_act<T>(GemmActRunner&, cudaStream_t, const GemmActProblem&, const T*, const T*, const T*, const T*, T*, \
                                          GemmActScratch&);                                                                                \
  template int gemm_act_candidates<T>(GemmActRunner&, const GemmActProblem&, const T*, const T*, const T*, const T*, const T*);
DF_INSTANTIATE(float)
DF_INSTANTIATE(__half)
DF_INSTANTIATE(__nv_bfloat16)
#undef DF_INSTANTIATE

}  // namespace deployfuse
