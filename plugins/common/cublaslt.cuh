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

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

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
  X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)                                                    \
  X(cublasLtMatmulAlgoGetIds) X(cublasLtMatmulAlgoInit) X(cublasLtMatmulAlgoCheck) X(cublasLtMatmulAlgoCapGetAttribute) \
  X(cublasLtMatmulAlgoConfigGetAttribute) X(cublasLtMatmulAlgoConfigSetAttribute)
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

// The epilogue computing the activation, after adding a bias vector or none (bias false: the fp8 GEMMs whose bias a norm took; a bias
// epilogue costs cuBLASLt's fp8 kernels 9-15 % at 1024 tokens on an H100 even for zeros: bench/results/fp8_epilogue_cost_h100.log); false
// for an activation cuBLASLt has none for (the ops' specs allow none of those).
inline bool epilogue(Act act, bool bias, cublasLtEpilogue_t* out) {
  switch (act) {
    case Act::kNone: *out = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT; return true;
    case Act::kRelu: *out = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU; return true;
    case Act::kGeluTanh: *out = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU; return true;
    default: return false;
  }
}

template <typename V>
bool set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  return library().cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)) == CUBLAS_STATUS_SUCCESS;
}

// An algorithm's configuration as the ids cuBLASLt takes: algo id, tile, stages, split-K, reduction scheme, CTA swizzle, custom
// option, inner shape, cluster shape (what tells two candidates apart).
using ConfigKey = std::array<int64_t, 9>;

inline ConfigKey config_key(const cublasLtMatmulAlgo_t& algo) {
  const Library& l = library();
  int32_t id = 0, splitk = 0;
  uint32_t tile = 0, stages = 0, reduction = 0, swizzle = 0, custom = 0;
  uint16_t inner = 0, cluster = 0;
  size_t written = 0;
  const auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto& value) {
    l.cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written);
  };
  get(CUBLASLT_ALGO_CONFIG_ID, id), get(CUBLASLT_ALGO_CONFIG_TILE_ID, tile), get(CUBLASLT_ALGO_CONFIG_STAGES_ID, stages);
  get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, splitk), get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, reduction);
  get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swizzle), get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, custom);
  get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, inner), get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster);
  return {id, tile, stages, splitk, reduction, swizzle, custom, inner, cluster};
}

// The ids an algorithm lists for a capability (tiles, stages); empty when it lists none.
inline std::vector<uint32_t> capability_ids(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  const Library& l = library();
  if (l.cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0) return {};
  std::vector<uint32_t> ids(bytes / sizeof(uint32_t));
  if (l.cublasLtMatmulAlgoCapGetAttribute(&algo, attr, ids.data(), ids.size() * sizeof(uint32_t), &bytes) != CUBLAS_STATUS_SUCCESS)
    return {};
  return ids;
}

template <typename V>
bool configure(cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, V value) {
  return library().cublasLtMatmulAlgoConfigSetAttribute(algo, attr, &value, sizeof(value)) == CUBLAS_STATUS_SUCCESS;
}

// Descriptors and candidate algorithms of one problem; C shares D's layout unless it has its own (a float8 D: C in fp16/bf16).
// The candidates are the heuristic's (up to kHeuristic), then, once a caller asks for one past them (extend), the configurations
// around them that the heuristic does not offer (variants): `algo` k names the same configuration wherever the GPU and cuBLASLt
// are the same, as the heuristic's ranking does.
template <int kHeuristic>
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;
  int heuristic_count = 0;  // the heuristic's, first in candidates

  int count() const { return static_cast<int>(candidates.size()); }

  // Most variants a plan appends: the tuner times each one (a CUDA graph apiece), so the list stays a few hundred long.
  static constexpr int kMaxVariants = 240;

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
    compute_ = compute;
    types_ = {a_layout.type, b_layout.type, (c_layout ? *c_layout : d_layout).type, d_layout.type};
    return l.cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS && layout(&a, a_layout) &&
           layout(&b, b_layout) && layout(&d, d_layout) && (c_layout == nullptr || layout(&c, *c_layout));
  }

  // Asks the heuristic for up to kHeuristic algorithms using at most workspace_bytes, for operands
  // aligned to align_abcd (bytes of A, B, C, D); false when it has none.
  bool query(cublasLtHandle_t handle, uint64_t workspace_bytes, const uint32_t (&align_abcd)[4]) {
    const Library& l = library();
    static const cublasLtMatmulPreferenceAttributes_t kAlignAttrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    workspace_bytes_ = workspace_bytes;
    std::copy(std::begin(align_abcd), std::end(align_abcd), align_.begin());
    cublasLtMatmulPreference_t pref = nullptr;
    bool ok = l.cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
              l.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                     sizeof(workspace_bytes)) == CUBLAS_STATUS_SUCCESS;
    for (int i = 0; ok && i < 4; ++i)
      ok = l.cublasLtMatmulPreferenceSetAttribute(pref, kAlignAttrs[i], &align_abcd[i], sizeof(uint32_t)) == CUBLAS_STATUS_SUCCESS;
    candidates.resize(kHeuristic);
    int found = 0;
    if (!ok || l.cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c ? c : d, d, pref, kHeuristic, candidates.data(), &found) !=
                   CUBLAS_STATUS_SUCCESS)
      found = 0;
    if (pref) l.cublasLtMatmulPreferenceDestroy(pref);
    candidates.resize(found);
    heuristic_count = found;
    return found > 0;
  }

  // Appends variants until candidate `upto` exists or none is left (kAllCandidates: every one, at most kMaxVariants): each heuristic
  // candidate with every cluster shape up to four CTAs and both CTA swizzles (the first 14 x heuristic_count configurations),
  // then each algorithm id cuBLASLt lists for these types with every tile and stages id it lists (cluster shape automatic, no
  // split-K: the defaults; split-K variants with a workspace left the tuned BERT-base no faster: h200_quant.md section 12); each
  // configuration once, in that order, where cublasLtMatmulAlgoCheck accepts it within the workspace and the operands' alignment. A later
  // call resumes where the last one stopped, so the list is the same however it is reached, and an artefact's stored index costs only the
  // checks up to it (a whole walk took 4.5-5.9 ms of host time a plan on the H100, section 12). An algorithm picks a kernel, never the
  // math.
  void extend(cublasLtHandle_t handle, int upto) {
    if (exhausted_ || heuristic_count == 0 || upto < count()) return;
    if (seen_.empty())
      for (const auto& candidate : candidates) seen_.insert(config_key(candidate.algo));
    const Library& l = library();
    int position = 0;  // in the walk's fixed sequence of configurations
    exhausted_ = walk_variants(handle, [&](const cublasLtMatmulAlgo_t& algo) {
      if (count() > upto || count() - heuristic_count >= kMaxVariants) return false;  // long enough: stop the walk
      if (position++ < examined_) return true;                                        // an earlier call examined it
      ++examined_;
      cublasLtMatmulHeuristicResult_t checked{};
      if (!seen_.insert(config_key(algo)).second ||
          l.cublasLtMatmulAlgoCheck(handle, desc, a, b, c ? c : d, d, &algo, &checked) != CUBLAS_STATUS_SUCCESS ||
          checked.workspaceSize > workspace_bytes_ || !aligned_for(algo))
        return true;
      checked.algo = algo;
      checked.state = CUBLAS_STATUS_SUCCESS;
      candidates.push_back(checked);
      return true;
    });
  }

  // The `algo`-th candidate (-1 or past the last: the heuristic's first).
  const cublasLtMatmulHeuristicResult_t& candidate(int algo) const { return candidates[algo >= 0 && algo < count() ? algo : 0]; }

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

 private:
  // Calls consider(algo) on each configuration of extend's sequence until it returns false; true when the sequence ran out.
  template <typename Consider>
  bool walk_variants(cublasLtHandle_t handle, Consider&& consider) const {
    const Library& l = library();
    static constexpr uint16_t kClusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO,  CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                             CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                                             CUBLASLT_CLUSTER_SHAPE_1x4x1};
    for (int i = 0; i < heuristic_count; ++i)
      for (uint16_t cluster : kClusters)
        for (uint32_t swizzle : {0u, 1u}) {
          cublasLtMatmulAlgo_t algo = candidates[i].algo;
          if (configure(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster) &&
              configure(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swizzle) && !consider(algo))
            return false;
        }
    int ids[128], id_count = 0;
    if (l.cublasLtMatmulAlgoGetIds(handle, compute_, CUDA_R_32F, types_[0], types_[1], types_[2], types_[3], 128, ids, &id_count) !=
        CUBLAS_STATUS_SUCCESS)
      return true;
    for (int i = 0; i < id_count; ++i) {
      cublasLtMatmulAlgo_t init;
      if (l.cublasLtMatmulAlgoInit(handle, compute_, CUDA_R_32F, types_[0], types_[1], types_[2], types_[3], ids[i], &init) !=
          CUBLAS_STATUS_SUCCESS)
        continue;
      std::vector<uint32_t> tiles = capability_ids(init, CUBLASLT_ALGO_CAP_TILE_IDS),
                            stages = capability_ids(init, CUBLASLT_ALGO_CAP_STAGES_IDS);
      if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
      if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
      for (uint32_t tile : tiles)
        for (uint32_t stage : stages) {
          cublasLtMatmulAlgo_t algo = init;
          if (configure(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, tile) && configure(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, stage) &&
              !consider(algo))
            return false;
        }
    }
    return true;
  }

  // Whether the operands' alignment (align_) meets what the algorithm needs of each (the heuristic was told; AlgoCheck is not).
  bool aligned_for(const cublasLtMatmulAlgo_t& algo) const {
    static const cublasLtMatmulAlgoCapAttributes_t kCaps[4] = {
        CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES,
        CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i) {
      uint32_t need = 0;
      size_t written = 0;
      if (library().cublasLtMatmulAlgoCapGetAttribute(&algo, kCaps[i], &need, sizeof(need), &written) != CUBLAS_STATUS_SUCCESS ||
          need > align_[i])
        return false;
    }
    return true;
  }

  cublasComputeType_t compute_ = CUBLAS_COMPUTE_32F;
  std::array<cudaDataType_t, 4> types_{};  // A, B, C, D
  uint64_t workspace_bytes_ = 0;
  std::array<uint32_t, 4> align_{};
  std::set<ConfigKey> seen_;  // the configurations in candidates or examined by extend
  int examined_ = 0;          // how far extend's walk has gone
  bool exhausted_ = false;    // it reached the end
};

// One runner's cuBLASLt handle (created on first use) and the plans of the problems it has run, by
// key; a plan is made once, so a later launch neither allocates nor queries the heuristic (CUDA-graph
// capture safe). A runner finds its plans inside with_plan, under one lock (a plan's descriptor
// takes each call's pointers).
// `algo` that asks a plan for every candidate, its variants included (what a runner's `candidates` counts).
constexpr int kAllCandidates = 1 << 30;

template <typename Key, typename PlanT>
class Plans {
 public:
  ~Plans() {
    if (!library().error.empty()) return;
    for (auto& entry : plans_) entry.second.release();
    if (handle_) library().cublasLtDestroy(handle_);
  }

  // The plan of key, made by make(PlanT&, cublasLtHandle_t) -> bool on first use, with its variants where `algo` indexes past the
  // heuristic's candidates (kAllCandidates: always); null with *err set when there is none (the library missing, no handle, or make
  // found no algorithm).
  template <typename Make>
  const PlanT* find(const Key& key, Make&& make, int algo, cudaError_t* err) {
    if (!library().error.empty()) return fail(cudaErrorSharedObjectInitFailed, err);
    auto found = plans_.find(key);
    PlanT* plan = found != plans_.end() ? &found->second : nullptr;
    if (plan == nullptr) {
      if (handle_ == nullptr && library().cublasLtCreate(&handle_) != CUBLAS_STATUS_SUCCESS) return fail(cudaErrorInitializationError, err);
      plan = &plans_[key];
      if (!make(*plan, handle_)) {
        plan->candidates.clear();
        plan->heuristic_count = 0;
      }
    }
    if (plan->count() == 0) return fail(cudaErrorNotSupported, err);
    if (algo >= plan->heuristic_count) plan->extend(handle_, algo);
    return plan;
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

  // What a runner's `candidates` answers: the count of the plan plan_of finds (plan_of asks for kAllCandidates), or -error.
  template <typename PlanOf>
  int candidates(PlanOf&& plan_of) {
    int count = 0;
    const cudaError_t err = with_plan(plan_of, [&](const PlanT& plan) {
      count = plan.count();
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
