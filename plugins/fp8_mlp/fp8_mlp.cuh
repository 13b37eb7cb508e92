// Fp8Mlp CUDA launcher on Fp8GemmAct's cuBLASLt runner: Y[m, n2] = dq(H) @ dq(W2)^T + b2 with H = q(act(dq(q(X)) @ dq(W1)^T + b1),
// h_scale) float8e4m3fn [m, n1], which never leaves float8: (1) one kernel quantizes X into the scratch and, unless the caller gives
// it, writes 1/h_scale there (one thread; with X given in float8, a one-thread kernel of its own), (2) FC1's fp8 GEMM writes H in
// float8 into the scratch (bias + activation epilogue, D scale 1/h_scale), (3) FC2's fp8 GEMM reads H as its float8 X (B scale
// h_scale) and writes Y with b2. n1 must be a multiple of 16 (H's rows of 16 bytes); K and N2 take Fp8GemmAct's padded copies where
// they need them. fp16 / bf16 as Fp8GemmAct; no host sync, no allocation: CUDA-graph capturable once a shape has run.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "common/activation.h"
#include "fp8_gemm_act/fp8_gemm_act.cuh"

namespace deployfuse {

struct Fp8MlpProblem {
  int64_t m, k, n1, n2;
  Act act;  // FC1's
  bool fast_accum = true;
  // FC1's and FC2's candidate, each as Fp8GemmActProblem::algo (-1: the heuristic's first choice; k >= 0: its k-th candidate)
  int algo1 = -1, algo2 = -1;
  // X already in float8e4m3fn [m, k] (k a multiple of 16; SkipLayerNormFp8's YQ): no quantize pass, x_scale is its scale
  bool x_fp8 = false;
};

// The scratch bytes one launch asks for: X in float8 (none when p.x_fp8), 1/h_scale, H, and the larger of the two GEMMs' scratch
// (padded copies; no cuBLASLt workspace unless DEPLOYFUSE_FP8_GEMM_WORKSPACE=1: fp8_gemm_act.cu); each part rounded up to 256 bytes.
size_t fp8_mlp_scratch_bytes(const Fp8MlpProblem& p, size_t elem_bytes);

// x: T [m, k], or float8e4m3fn [m, k] when p.x_fp8. Scales: device pointers to one float each; w1 float8e4m3fn [n1, k], w2 [n2, n1];
// b1, b2: T [n1], [n2], or nullptr for none (as launch_fp8_gemm_act's bias).
// h_scale_inverse: a device float holding 1 / *h_scale (FC1's D scale; Fp8MlpHScaleInverse's), or nullptr: the launch writes it into
// the scratch (with X given in float8, one more kernel). The runner is one kernel instance's (its plans: FC1's and FC2's).
// cudaErrorNotSupported for n1 (or, with p.x_fp8, k) not a multiple of 16, else launch_fp8_gemm_act's errors.
template <typename T>
cudaError_t launch_fp8_mlp(Fp8GemmActRunner& runner, cudaStream_t stream, const Fp8MlpProblem& p, const void* x, const float* x_scale,
                           const uint8_t* w1, const float* w1_scale, const T* b1, const float* h_scale, const uint8_t* w2,
                           const float* w2_scale, const T* b2, T* y, GemmActScratch& scratch, const float* h_scale_inverse);

// 1 / h_scale kept on the device by one kernel instance whose h_scale never changes (an ONNX initializer: static calibration), so
// that its launches, and a CUDA graph captured from them, need no reciprocal kernel: the first get outside a capture allocates the
// float, writes it with the launcher's own one-thread kernel (the same IEEE division, so the same bits) and waits for that stream.
// Thread safe; no CUDA call before the first get.
class Fp8MlpHScaleInverse {
 public:
  Fp8MlpHScaleInverse() = default;
  Fp8MlpHScaleInverse(const Fp8MlpHScaleInverse&) = delete;
  Fp8MlpHScaleInverse& operator=(const Fp8MlpHScaleInverse&) = delete;
  ~Fp8MlpHScaleInverse();
  // *inverse: the device 1 / *h_scale for launch_fp8_mlp's h_scale_inverse, or nullptr (the launch computes it) during a capture
  // before any get outside one, or for an h_scale other than the one it was written from; the CUDA error of writing it.
  cudaError_t get(cudaStream_t stream, const float* h_scale, const float** inverse);

 private:
  std::mutex mutex_;
  const float* of_ = nullptr;  // the h_scale it was written from
  float* inverse_ = nullptr;
};

// How many candidates (the heuristic's and their variants) algo1 and algo2 may index (into *fc1, *fc2): the counts of the plans FC1 (H out
// in float8) and FC2 run on with these pointers (X's float8 copy and H lie 256-byte aligned in the scratch); else the error launch_fp8_mlp
// gives.
template <typename T>
cudaError_t fp8_mlp_candidates(Fp8GemmActRunner& runner, const Fp8MlpProblem& p, const float* x_scale, const uint8_t* w1,
                               const float* w1_scale, const T* b1, const float* h_scale, const uint8_t* w2, const float* w2_scale,
                               const T* b2, const T* y, int* fc1, int* fc2);

}  // namespace deployfuse
