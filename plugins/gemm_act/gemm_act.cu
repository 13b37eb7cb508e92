// GemmAct on cuBLASLt, the activation in the epilogue (bias, bias+ReLU, bias+tanh-GELU). Row-major Y = X W is column-major Yᵀ = Wᵀ Xᵀ, so
// cuBLASLt gets A = W (n x k, ld n), B = X (k x m, ld k), D = Y (n x m, ld n): the bias then runs along D's rows, as cuBLASLt's bias
// epilogue wants it, and nothing is transposed. A residual is C with beta = 1. fp32 computes in TF32 (what ONNX Runtime's CUDA EP and
// TensorRT do by default), fp16/bf16 in fp32.
//
// The library is opened with dlopen by soname on first use: a process that runs ONNX Runtime's
// CUDA EP or torch has it loaded already, and libdeployfuse_ort keeps no link-time dependency on it.
#include <cublasLt.h>
#include <dlfcn.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "common/dtype_dispatch.h"
#include "gemm_act/gemm_act.cuh"

namespace deployfuse {
namespace {

#define DF_STR2(x) #x
#define DF_STR(x) DF_STR2(x)
constexpr const char* kLibrary = "libcublasLt.so." DF_STR(CUBLAS_VER_MAJOR);

// The cuBLASLt entry points GemmAct uses, resolved once by name; each member is named like its function.
// clang-format off
#define DF_CUBLASLT_FUNCTIONS(X)                                                                         \
  X(cublasLtCreate) X(cublasLtDestroy)                                                                  \
  X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)            \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)                                          \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)
// clang-format on
struct Lt {
#define DF_MEMBER(name) decltype(&::name) name = nullptr;
  DF_CUBLASLT_FUNCTIONS(DF_MEMBER)
#undef DF_MEMBER
  std::string error;  // non-empty: unusable, and why
};

const Lt& lt() {
  static const Lt loaded = [] {
    Lt l;
    void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      l.error = std::string("GemmAct needs ") + kLibrary +
                " (cuBLASLt): not found; install nvidia-cublas or add its lib folder to LD_LIBRARY_PATH (torch and ONNX Runtime's CUDA EP "
                "load it when imported first)";
      return l;
    }
#define DF_RESOLVE(name)                                           \
  l.name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name)); \
  if (l.name == nullptr && l.error.empty()) l.error = std::string(kLibrary) + " lacks " #name;
    DF_CUBLASLT_FUNCTIONS(DF_RESOLVE)
#undef DF_RESOLVE
    return l;  // the library stays open for the process's lifetime
  }();
  return loaded;
}

template <typename T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, __half>) return CUDA_R_16F;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return CUDA_R_16BF;
  return CUDA_R_32F;
}

uint32_t alignment(const void* p) {  // the largest power of two up to 256 the address is a multiple of
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// The epilogue computing the activation; false for one cuBLASLt has none for (the op's spec allows none of those).
bool epilogue(Act act, cublasLtEpilogue_t* out) {
  switch (act) {
    case Act::kNone: *out = CUBLASLT_EPILOGUE_BIAS; return true;
    case Act::kRelu: *out = CUBLASLT_EPILOGUE_RELU_BIAS; return true;
    case Act::kGeluTanh: *out = CUBLASLT_EPILOGUE_GELU_BIAS; return true;
    default: return false;
  }
}

// Descriptors and heuristic candidates of one problem (shape, type, epilogue, alignments).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulHeuristicResult_t candidates[kGemmActCandidates];
  int count = 0;
};

using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int, bool, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;

}  // namespace

class GemmActRunner {
 public:
  ~GemmActRunner() {
    if (!lt().error.empty()) return;
    for (auto& entry : plans_) {
      Plan& p = entry.second;
      if (p.a) lt().cublasLtMatrixLayoutDestroy(p.a);
      if (p.b) lt().cublasLtMatrixLayoutDestroy(p.b);
      if (p.d) lt().cublasLtMatrixLayoutDestroy(p.d);
      if (p.desc) lt().cublasLtMatmulDescDestroy(p.desc);
    }
    if (handle_) lt().cublasLtDestroy(handle_);
  }

  // The plan of the problem (made on first use); null with *err set when there is none.
  template <typename T>
  const Plan* plan(const GemmActProblem& p, const T* x, const T* w, const T* bias, const T* residual, const T* y, cudaError_t* err) {
    const Lt& l = lt();
    if (!l.error.empty()) return fail(cudaErrorSharedObjectInitFailed, err);
    cublasLtEpilogue_t epi;
    if (!epilogue(p.act, &epi)) return fail(cudaErrorInvalidValue, err);
    const PlanKey key{static_cast<int>(cuda_type<T>()),
                      p.m,
                      p.n,
                      p.k,
                      static_cast<int>(epi),
                      residual != nullptr,
                      alignment(x),
                      alignment(w),
                      alignment(bias),
                      alignment(residual ? residual : y),
                      alignment(y)};
    auto found = plans_.find(key);
    if (found != plans_.end()) return found->second.count > 0 ? &found->second : fail(cudaErrorNotSupported, err);
    if (handle_ == nullptr && l.cublasLtCreate(&handle_) != CUBLAS_STATUS_SUCCESS) return fail(cudaErrorInitializationError, err);
    Plan& plan = plans_[key];
    const cudaDataType_t type = cuda_type<T>();
    const cublasComputeType_t compute = type == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    bool ok =
        l.cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        l.cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)) == CUBLAS_STATUS_SUCCESS &&
        l.cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)) == CUBLAS_STATUS_SUCCESS &&
        l.cublasLtMatrixLayoutCreate(&plan.a, type, p.n, p.k, p.n) == CUBLAS_STATUS_SUCCESS &&
        l.cublasLtMatrixLayoutCreate(&plan.b, type, p.k, p.m, p.k) == CUBLAS_STATUS_SUCCESS &&
        l.cublasLtMatrixLayoutCreate(&plan.d, type, p.n, p.m, p.n) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreference_t pref = nullptr;
    ok = ok && l.cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
    const uint64_t workspace = kGemmActWorkspaceBytes;
    const uint32_t aligns[4] = {alignment(w), alignment(x), alignment(residual ? residual : y), alignment(y)};
    const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    ok = ok && l.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)) ==
                   CUBLAS_STATUS_SUCCESS;
    for (int i = 0; ok && i < 4; ++i)
      ok = l.cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &aligns[i], sizeof(uint32_t)) == CUBLAS_STATUS_SUCCESS;
    if (ok && l.cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, kGemmActCandidates,
                                               plan.candidates, &plan.count) != CUBLAS_STATUS_SUCCESS)
      plan.count = 0;
    if (pref) l.cublasLtMatmulPreferenceDestroy(pref);
    return plan.count > 0 ? &plan : fail(cudaErrorNotSupported, err);
  }

  template <typename T>
  cudaError_t launch(cudaStream_t stream, const GemmActProblem& p, const T* x, const T* w, const T* bias, const T* residual, T* y,
                     GemmActScratch& scratch) {
    if (p.m == 0 || p.n == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex_);  // the plan's descriptor takes this call's bias pointer
    cudaError_t err = cudaSuccess;
    const Plan* plan = this->plan(p, x, w, bias, residual, y, &err);
    if (plan == nullptr) return err;
    const cublasLtMatmulHeuristicResult_t& chosen = plan->candidates[p.algo >= 0 && p.algo < plan->count ? p.algo : 0];
    void* workspace = chosen.workspaceSize ? scratch.get(chosen.workspaceSize) : nullptr;
    if (chosen.workspaceSize && workspace == nullptr) return cudaErrorMemoryAllocation;
    const Lt& l = lt();
    if (l.cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)) != CUBLAS_STATUS_SUCCESS)
      return cudaErrorInvalidValue;
    const float one = 1.f, beta = residual ? 1.f : 0.f;
    if (l.cublasLtMatmul(handle_, plan->desc, &one, w, plan->a, x, plan->b, &beta, residual ? residual : y, plan->d, y, plan->d,
                         &chosen.algo, workspace, chosen.workspaceSize, stream) != CUBLAS_STATUS_SUCCESS)
      return cudaErrorLaunchFailure;
    return cudaSuccess;
  }

  template <typename T>
  int candidates(const GemmActProblem& p, const T* x, const T* w, const T* bias, const T* residual, const T* y) {
    std::lock_guard<std::mutex> lock(mutex_);
    cudaError_t err = cudaSuccess;
    const Plan* plan = this->plan(p, x, w, bias, residual, y, &err);
    return plan ? plan->count : -static_cast<int>(err);
  }

 private:
  static const Plan* fail(cudaError_t why, cudaError_t* err) {
    *err = why;
    return nullptr;
  }

  std::mutex mutex_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<PlanKey, Plan> plans_;
};

std::shared_ptr<GemmActRunner> make_gemm_act_runner() { return std::make_shared<GemmActRunner>(); }

const char* gemm_act_unavailable() {
  const Lt& l = lt();
  return l.error.empty() ? nullptr : l.error.c_str();
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
