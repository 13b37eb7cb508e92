// What the cuBLASLt launchers (GemmAct, Fp8GemmAct) share, for their .cu files only (cublasLt.h is on
// the CUDA kernels' include path alone): the library, opened with dlopen by soname on first use (a
// process that runs ONNX Runtime's CUDA EP or torch has it loaded already, and no deployfuse library
// keeps a link-time dependency on it), the element types and epilogues the ops map to, and a cache
// of plans (descriptors and heuristic candidates per problem) behind one handle.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "common/activation.h"

namespace deployfuse {
namespace cublaslt {

#define DF_STR2(x) #x
#define DF_STR(x) DF_STR2(x)
constexpr const char* kLibrary = "libcublasLt.so." DF_STR(CUBLAS_VER_MAJOR);
#undef DF_STR
#undef DF_STR2

// The entry points the ops use, resolved once by name; each member is named like its function.
// clang-format off
#define DF_CUBLASLT_FUNCTIONS(X)                                                                         \
  X(cublasLtCreate) X(cublasLtDestroy)                                                                  \
  X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)            \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)                                          \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)
// clang-format on
struct Library {
#define DF_MEMBER(name) decltype(&::name) name = nullptr;
  DF_CUBLASLT_FUNCTIONS(DF_MEMBER)
#undef DF_MEMBER
  std::string error;  // non-empty: unusable, and why
};

// The process's cuBLASLt (one for every op: an inline function's static is one object).
inline const Library& library() {
  static const Library loaded = [] {
    Library l;
    void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      l.error = std::string(kLibrary) +
                " (cuBLASLt) not found: install nvidia-cublas or add its lib folder to LD_LIBRARY_PATH (torch and ONNX Runtime's CUDA EP "
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
constexpr cudaDataType_t data_type() {
  if constexpr (std::is_same_v<T, __half>) return CUDA_R_16F;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return CUDA_R_16BF;
  return CUDA_R_32F;
}

inline uint32_t alignment(const void* p) {  // the largest power of two up to 256 the address is a multiple of
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// The bias epilogue computing the activation; false for one cuBLASLt has none for (the ops' specs allow none of those).
inline bool bias_epilogue(Act act, cublasLtEpilogue_t* out) {
  switch (act) {
    case Act::kNone: *out = CUBLASLT_EPILOGUE_BIAS; return true;
    case Act::kRelu: *out = CUBLASLT_EPILOGUE_RELU_BIAS; return true;
    case Act::kGeluTanh: *out = CUBLASLT_EPILOGUE_GELU_BIAS; return true;
    default: return false;
  }
}

template <typename V>
bool set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  return library().cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)) == CUBLAS_STATUS_SUCCESS;
}

// Descriptors and heuristic candidates of one problem; C shares D's layout unless it has its own (a float8 D: C in fp16/bf16).
template <int kCandidates>
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulHeuristicResult_t candidates[kCandidates];
  int count = 0;

  // One matrix as stored: column-major rows x cols, leading dimension ld.
  struct Layout {
    cudaDataType_t type;
    int64_t rows, cols, ld;
  };

  // Creates the descriptor (fp32 scale type) and the layouts of A, B and D, and of C where c_layout is given.
  bool create(cublasComputeType_t compute, const Layout& a_layout, const Layout& b_layout, const Layout& d_layout,
              const Layout* c_layout = nullptr) {
    const Library& l = library();
    const auto layout = [&](cublasLtMatrixLayout_t* out, const Layout& m) {
      return l.cublasLtMatrixLayoutCreate(out, m.type, m.rows, m.cols, m.ld) == CUBLAS_STATUS_SUCCESS;
    };
    return l.cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS && layout(&a, a_layout) &&
           layout(&b, b_layout) && layout(&d, d_layout) && (c_layout == nullptr || layout(&c, *c_layout));
  }

  // Asks the heuristic for up to kCandidates algorithms using at most workspace_bytes, for operands
  // aligned to align_abcd (bytes of A, B, C, D); false when it has none.
  bool query(cublasLtHandle_t handle, uint64_t workspace_bytes, const uint32_t (&align_abcd)[4]) {
    const Library& l = library();
    static const cublasLtMatmulPreferenceAttributes_t kAlignAttrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    cublasLtMatmulPreference_t pref = nullptr;
    bool ok = l.cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
              l.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                     sizeof(workspace_bytes)) == CUBLAS_STATUS_SUCCESS;
    for (int i = 0; ok && i < 4; ++i)
      ok = l.cublasLtMatmulPreferenceSetAttribute(pref, kAlignAttrs[i], &align_abcd[i], sizeof(uint32_t)) == CUBLAS_STATUS_SUCCESS;
    if (!ok ||
        l.cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c ? c : d, d, pref, kCandidates, candidates, &count) != CUBLAS_STATUS_SUCCESS)
      count = 0;
    if (pref) l.cublasLtMatmulPreferenceDestroy(pref);
    return count > 0;
  }

  // The `algo`-th candidate (-1 or past the last: the heuristic's first).
  const cublasLtMatmulHeuristicResult_t& candidate(int algo) const { return candidates[algo >= 0 && algo < count ? algo : 0]; }

  // D = epilogue(op(A) op(B) + beta C) by the `algo`-th candidate; workspace: its workspaceSize bytes.
  cudaError_t matmul(cublasLtHandle_t handle, int algo, const void* a_data, const void* b_data, float beta, const void* c_data,
                     void* d_data, void* workspace, cudaStream_t stream) const {
    const cublasLtMatmulHeuristicResult_t& chosen = candidate(algo);
    const float alpha = 1.f;
    return library().cublasLtMatmul(handle, desc, &alpha, a_data, a, b_data, b, &beta, c_data, c ? c : d, d_data, d, &chosen.algo,
                                    workspace, chosen.workspaceSize, stream) == CUBLAS_STATUS_SUCCESS
               ? cudaSuccess
               : cudaErrorLaunchFailure;
  }

  void release() {
    const Library& l = library();
    if (a) l.cublasLtMatrixLayoutDestroy(a);
    if (b) l.cublasLtMatrixLayoutDestroy(b);
    if (c) l.cublasLtMatrixLayoutDestroy(c);
    if (d) l.cublasLtMatrixLayoutDestroy(d);
    if (desc) l.cublasLtMatmulDescDestroy(desc);
  }
};

// One runner's cuBLASLt handle (created on first use) and the plans of the problems it has run, by
// key; a plan is made once, so a later launch neither allocates nor queries the heuristic (CUDA-graph
// capture safe). A runner finds its plans inside with_plan, under one lock (a plan's descriptor
// takes each call's pointers).
template <typename Key, typename PlanT>
class Plans {
 public:
  ~Plans() {
    if (!library().error.empty()) return;
    for (auto& entry : plans_) entry.second.release();
    if (handle_) library().cublasLtDestroy(handle_);
  }

  // The plan of key, made by make(PlanT&, cublasLtHandle_t) -> bool on first use; null with *err set
  // when there is none (the library missing, no handle, or make found no algorithm).
  template <typename Make>
  const PlanT* find(const Key& key, Make&& make, cudaError_t* err) {
    if (!library().error.empty()) return fail(cudaErrorSharedObjectInitFailed, err);
    auto found = plans_.find(key);
    if (found != plans_.end()) return found->second.count > 0 ? &found->second : fail(cudaErrorNotSupported, err);
    if (handle_ == nullptr && library().cublasLtCreate(&handle_) != CUBLAS_STATUS_SUCCESS) return fail(cudaErrorInitializationError, err);
    PlanT& plan = plans_[key];
    if (!make(plan, handle_)) plan.count = 0;
    return plan.count > 0 ? &plan : fail(cudaErrorNotSupported, err);
  }

  cublasLtHandle_t handle() const { return handle_; }

  // launch(const PlanT&) -> cudaError_t on the plan plan_of(cudaError_t*) finds (by find), under
  // the lock; plan_of's error when there is none.
  template <typename PlanOf, typename Launch>
  cudaError_t with_plan(PlanOf&& plan_of, Launch&& launch) {
    std::lock_guard<std::mutex> lock(mutex_);
    cudaError_t err = cudaSuccess;
    const PlanT* plan = plan_of(&err);
    return plan ? launch(*plan) : err;
  }

  // What a runner's `candidates` answers: the count of the plan plan_of finds, or -error.
  template <typename PlanOf>
  int candidates(PlanOf&& plan_of) {
    int count = 0;
    const cudaError_t err = with_plan(plan_of, [&](const PlanT& plan) {
      count = plan.count;
      return cudaSuccess;
    });
    return err == cudaSuccess ? count : -static_cast<int>(err);
  }

 private:
  static const PlanT* fail(cudaError_t why, cudaError_t* err) {
    *err = why;
    return nullptr;
  }

  std::mutex mutex_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, PlanT> plans_;
};

}  // namespace cublaslt
}  // namespace deployfuse
