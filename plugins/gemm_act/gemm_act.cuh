// GemmAct CUDA launcher on cuBLASLt: Y[m, n] = act(X[m, k] @ W[k, n] + bias[n] (+ residual[m, n])),
// row-major, the bias / ReLU / tanh-GELU epilogue fused into the GEMM. cuBLASLt is opened with dlopen on first use (no
// link-time dependency: ONNX Runtime's CUDA EP and torch load it into the process anyway).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/activation.h"

namespace deployfuse {

// The most workspace an algorithm may ask for (NVIDIA's advice for Hopper); a TensorRT plugin
// reserves this much, ONNX Runtime's allocator hands out what the chosen algorithm needs.
constexpr size_t kGemmActWorkspaceBytes = size_t(32) << 20;
// How many of the cuBLASLt heuristic's candidates a plan asks for; GemmAct's `algo` indexes them (Fp8GemmAct's also the
// configurations around them, common/cublaslt.cuh Plan::extend).
constexpr int kGemmActCandidates = 16;

struct GemmActProblem {
  int64_t m, n, k;
  Act act;
  int algo;  // -1: the heuristic's first choice; k >= 0: its k-th candidate (the first when there are fewer)
};

// Scratch memory for one launch: the launcher asks for the bytes its algorithm needs (null: none
// to be had, the launch fails with cudaErrorMemoryAllocation).
struct GemmActScratch {
  virtual void* get(size_t bytes) = 0;

 protected:
  ~GemmActScratch() = default;
};

// A fixed buffer (a TensorRT plugin's workspace, a benchmark's tensor).
struct FixedScratch final : GemmActScratch {
  void* ptr;
  size_t bytes;
  FixedScratch(void* p, size_t n) : ptr(p), bytes(n) {}
  void* get(size_t need) override { return need <= bytes ? ptr : nullptr; }
};

// One per kernel instance: the cuBLASLt handle (created on first use) and the plans of the shapes
// it has run (descriptors and the heuristic's candidates), so a launch neither allocates nor
// queries the heuristic twice; safe under CUDA graph capture once a shape has run.
class GemmActRunner;
std::shared_ptr<GemmActRunner> make_gemm_act_runner();

// Why cuBLASLt cannot be used (the library missing), or null when it can.
const char* gemm_act_unavailable();

// residual may be null. cudaErrorSharedObjectInitFailed when cuBLASLt is missing,
// cudaErrorNotSupported when it has no algorithm for the problem, cudaErrorInvalidValue for an
// activation no epilogue computes (only none, relu and gelu_tanh).
template <typename T>
cudaError_t launch_gemm_act(GemmActRunner& runner, cudaStream_t stream, const GemmActProblem& p, const T* x, const T* w, const T* bias,
                            const T* residual, T* y, GemmActScratch& scratch);

// How many heuristic candidates the problem has with these pointers (their alignment matters);
// negative: a cudaError_t as for launch_gemm_act.
template <typename T>
int gemm_act_candidates(GemmActRunner& runner, const GemmActProblem& p, const T* x, const T* w, const T* bias, const T* residual,
                        const T* y);

}  // namespace deployfuse
