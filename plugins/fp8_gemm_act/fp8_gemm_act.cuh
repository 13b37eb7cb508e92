// Fp8GemmAct CUDA launcher on cuBLASLt: Y[m, n] = act(dq(q(X, x_scale)) @ dq(W, w_scale)^T + bias[n]) with W float8e4m3fn
// [n, k]. One vectorised kernel quantizes X into float8e4m3fn scratch (none for an X given in float8), then one cuBLASLt fp8 GEMM ("TN",
// the scales as device pointers, fp32 accumulation, fast or full: fast_accum) writes Y with the bias / ReLU / tanh-GELU epilogue. Needs an
// sm_89+ GPU (Ada, Hopper). Any K and N: cuBLASLt's fp8 kernels want K a multiple of 16 and N a multiple of 16 bytes of T, so otherwise X's
// float8 copy and a copy of W are padded with zeros to the next multiple of 16, W and the bias to N rounded up, and Y is written to a
// padded copy in the scratch and copied into Y (extra passes; the models' GEMMs need none). Y and the bias take T = fp16 or bf16:
// cuBLASLt's fp8 kernels write fp32 only with a bf16 bias, which would round the op's fp32 Bias, so fp32 answers cudaErrorNotSupported. The
// scratch interface is GemmAct's (the same cuBLASLt); the algorithms get no workspace (fp8_gemm_act.cu says why).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/activation.h"
#include "gemm_act/gemm_act.cuh"

namespace deployfuse {

constexpr int64_t kFp8GemmActKMultiple = 16;
// K rounded up to kFp8GemmActKMultiple: the bytes of a row of X's float8 copy.
constexpr int64_t fp8_gemm_act_k_padded(int64_t k) { return (k + kFp8GemmActKMultiple - 1) / kFp8GemmActKMultiple * kFp8GemmActKMultiple; }

struct Fp8GemmActProblem {
  int64_t m, n, k;
  Act act;
  int algo;  // -1: the heuristic's first choice; k >= 0: the k-th candidate (heuristic's, then variants; the first if fewer)
  // cuBLASLt's fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM; torchao's float8 default): on Hopper the fp8 tensor-core
  // partial sums are not promoted to full fp32 as often, which rounds the accumulation more coarsely; false: full fp32.
  bool fast_accum = true;
  // X already in float8e4m3fn as [m, fp8_gemm_act_k_padded(k)] (zeros past k, as fp8_quantize_e4m3 writes it): no quantize pass,
  // x_scale is its scale. Fp8Mlp's GEMMs: FC1 on X quantized by its own pass (or given in float8), FC2 on FC1's float8 output;
  // Fp8GemmAct fed a float8 X (SkipLayerNormFp8's YQ, k a multiple of 16).
  bool x_fp8 = false;
  // D in float8e4m3fn [m, n] = e4m3(result · *d_scale) (d_scale: a device float, the reciprocal of the output's scale; cuBLASLt
  // rounds to nearest even and saturates), C and the bias in T; n a multiple of 16 (no padded copy of a float8 D).
  bool d_fp8 = false;
};

// q [m, kp] = e4m3(x [m, k] / *scale) with kp = fp8_gemm_act_k_padded(k), zeros past k: the quantize pass of a launch
// alone (one kernel; the 16-element vectorised one when kp = k and x and q are 16-byte aligned).
// recip_of, recip: when given, one thread of the kernel also writes *recip = 1 / *recip_of (Fp8Mlp: FC1's D scale, with no
// launch of its own).
template <typename T>
cudaError_t fp8_quantize_e4m3(cudaStream_t stream, const T* x, const float* scale, uint8_t* q, int64_t m, int64_t k,
                              const float* recip_of = nullptr, float* recip = nullptr);

// The scratch bytes one launch asks for at most (elem_bytes: sizeof(T)): X in float8, the padded copies of W, Bias and Y
// where they need one (each rounded up to 256 bytes), and kGemmActWorkspaceBytes for the algorithm under DEPLOYFUSE_FP8_GEMM_WORKSPACE=1.
size_t fp8_gemm_act_scratch_bytes(int64_t m, int64_t n, int64_t k, size_t elem_bytes);
// The same for any problem (x_fp8: no float8 copy of X).
size_t fp8_gemm_scratch_bytes(const Fp8GemmActProblem& p, size_t elem_bytes);

// One per kernel instance: the cuBLASLt handle and the plans of the shapes it has run, as GemmAct's
// runner; safe under CUDA graph capture once a shape has run.
class Fp8GemmActRunner;
std::shared_ptr<Fp8GemmActRunner> make_fp8_gemm_act_runner();

// x: T [m, k], or float8e4m3fn [m, fp8_gemm_act_k_padded(k)] when p.x_fp8 (already q(X, x_scale): SkipLayerNormFp8's YQ).
// x_scale, w_scale: device pointers to one float each. bias: T [n], or nullptr for none (an epilogue without a bias, which cuBLASLt's
// fp8 kernels run faster than one adding zeros). cudaErrorSharedObjectInitFailed when cuBLASLt
// is missing (gemm_act_unavailable says why), cudaErrorInvalidValue for K = 0, an activation no
// epilogue computes or a scratch not 256-byte aligned, cudaErrorNotSupported when cuBLASLt has no fp8 algorithm for the
// problem (fp32, a GPU before sm_89, misaligned pointers), cudaErrorMemoryAllocation when scratch
// gives no memory.
template <typename T>
cudaError_t launch_fp8_gemm_act(Fp8GemmActRunner& runner, cudaStream_t stream, const Fp8GemmActProblem& p, const void* x,
                                const float* x_scale, const uint8_t* w, const float* w_scale, const T* bias, T* y, GemmActScratch& scratch);

// The runner's general form, which launch_fp8_gemm_act is with Y in T: x is T [m, k], or float8e4m3fn [m, kp] when p.x_fp8;
// y is T [m, n], or float8e4m3fn [m, n] scaled by *d_scale (a device float) when p.d_fp8. The errors of launch_fp8_gemm_act, and
// cudaErrorInvalidValue for p.d_fp8 without d_scale, cudaErrorNotSupported for p.d_fp8 with n not a multiple of 16.
template <typename T>
cudaError_t launch_fp8_gemm(Fp8GemmActRunner& runner, cudaStream_t stream, const Fp8GemmActProblem& p, const void* x, const float* x_scale,
                            const uint8_t* w, const float* w_scale, const T* bias, void* y, const float* d_scale, GemmActScratch& scratch);

// How many candidates `algo` may index (the heuristic's and their variants) for the problem with these pointers (X's float8
// copy is 256-byte aligned in the scratch); negative: a cudaError_t as for launch_fp8_gemm_act.
template <typename T>
int fp8_gemm_act_candidates(Fp8GemmActRunner& runner, const Fp8GemmActProblem& p, const float* x_scale, const uint8_t* w,
                            const float* w_scale, const T* bias, const T* y);

// Its general form, for the problems launch_fp8_gemm runs (Fp8Mlp's GEMMs): x and y as launch_fp8_gemm takes them, of which only the
// alignment counts (nullptr: a part of a 256-byte aligned scratch); d_scale, when p.d_fp8: any device float (each launch sets its own).
template <typename T>
int fp8_gemm_candidates(Fp8GemmActRunner& runner, const Fp8GemmActProblem& p, const void* x, const float* x_scale, const uint8_t* w,
                        const float* w_scale, const T* bias, const void* y, const float* d_scale);

}  // namespace deployfuse
