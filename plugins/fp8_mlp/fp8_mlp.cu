// Fp8Mlp: X's quantize pass, then Fp8GemmAct's runner twice on problems whose X is already float8 (FC1: X's copy, FC2: H) and,
// for FC1, whose D is float8 (H, scaled by 1/h_scale: the caller's h_scale_inverse, else what the quantize pass, or with X given in
// float8 a one-thread kernel, wrote). The scratch: [X in float8 | 1/h_scale | H | the GEMMs' own scratch], every part 256-byte
// aligned, the last shared by the two GEMMs (stream-ordered). Each GEMM takes its own candidate (algo1, algo2) from its own plan, as
// Fp8GemmAct's algo.
#include <algorithm>

#include "common/cuda_check.h"
#include "common/dtype.cuh"
#include "fp8_mlp/fp8_mlp.cuh"

namespace deployfuse {
namespace {

constexpr size_t kAlign = 256;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

Fp8GemmActProblem fc1(const Fp8MlpProblem& p) {
  Fp8GemmActProblem g{p.m, p.n1, p.k, p.act, p.algo1, p.fast_accum};
  g.x_fp8 = g.d_fp8 = true;
  return g;
}

Fp8GemmActProblem fc2(const Fp8MlpProblem& p) {
  Fp8GemmActProblem g{p.m, p.n2, p.n1, Act::kNone, p.algo2, p.fast_accum};
  g.x_fp8 = true;
  return g;
}

struct MlpScratch {
  size_t xq, recip, h, gemm;
  MlpScratch(const Fp8MlpProblem& p, size_t elem_bytes)
      : xq(p.x_fp8 ? 0 : aligned(static_cast<size_t>(p.m * fp8_gemm_act_k_padded(p.k)))),
        recip(aligned(sizeof(float))),
        h(aligned(static_cast<size_t>(p.m * p.n1))),
        gemm(std::max(fp8_gemm_scratch_bytes(fc1(p), elem_bytes), fp8_gemm_scratch_bytes(fc2(p), elem_bytes))) {}
  size_t bytes() const { return xq + recip + h + gemm; }
};

// What the shape alone refuses, before any CUDA call: N1 off H's float8 rows of 16 bytes, no K or no N1.
cudaError_t refusal(const Fp8MlpProblem& p) {
  if (p.n1 % kFp8GemmActKMultiple != 0 || (p.x_fp8 && p.k % kFp8GemmActKMultiple != 0)) return cudaErrorNotSupported;
  return p.k <= 0 || p.n1 == 0 ? cudaErrorInvalidValue : cudaSuccess;
}

// *recip = 1 / *of (IEEE division, as the quantize pass's): FC1's D scale where no quantize pass writes it (X given in float8) and
// the caller gives none, and Fp8MlpHScaleInverse's one write.
__global__ void reciprocal_kernel(const float* __restrict__ of, float* __restrict__ recip) { *recip = 1.f / *of; }

}  // namespace

Fp8MlpHScaleInverse::~Fp8MlpHScaleInverse() {
  if (inverse_ != nullptr) cudaFree(inverse_);  // at teardown the runtime may be gone: nothing to report to
}

cudaError_t Fp8MlpHScaleInverse::get(cudaStream_t stream, const float* h_scale, const float** inverse) {
  std::lock_guard<std::mutex> lock(mutex_);
  *inverse = nullptr;
  if (inverse_ != nullptr) {
    if (h_scale == of_) *inverse = inverse_;
    return cudaSuccess;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  DF_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return cudaSuccess;  // no allocation in a capture: the launch computes it this time
  float* written = nullptr;
  DF_RETURN_IF_ERROR(cudaMalloc(&written, sizeof(float)));
  reciprocal_kernel<<<1, 1, 0, stream>>>(h_scale, written);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);  // another thread's stream may read it as soon as it is kept
  if (err != cudaSuccess) {
    cudaFree(written);
    return err;
  }
  inverse_ = written;
  of_ = h_scale;
  *inverse = inverse_;
  return cudaSuccess;
}

size_t fp8_mlp_scratch_bytes(const Fp8MlpProblem& p, size_t elem_bytes) { return MlpScratch(p, elem_bytes).bytes(); }

template <typename T>
cudaError_t launch_fp8_mlp(Fp8GemmActRunner& runner, cudaStream_t stream, const Fp8MlpProblem& p, const void* x, const float* x_scale,
                           const uint8_t* w1, const float* w1_scale, const T* b1, const float* h_scale, const uint8_t* w2,
                           const float* w2_scale, const T* b2, T* y, GemmActScratch& scratch, const float* h_scale_inverse) {
  DF_RETURN_IF_ERROR(refusal(p));
  if (p.m == 0 || p.n2 == 0) return cudaSuccess;
  const MlpScratch at(p, sizeof(T));
  auto* xq = static_cast<uint8_t*>(scratch.get(at.bytes()));
  if (xq == nullptr) return cudaErrorMemoryAllocation;
  if (reinterpret_cast<uintptr_t>(xq) % kAlign != 0) return cudaErrorInvalidValue;
  auto* recip = reinterpret_cast<float*>(xq + at.xq);
  uint8_t* h = xq + at.xq + at.recip;
  FixedScratch gemm(h + at.h, at.gemm);
  const bool write_recip = h_scale_inverse == nullptr;
  if (!p.x_fp8) {
    DF_RETURN_IF_ERROR(fp8_quantize_e4m3(stream, static_cast<const T*>(x), x_scale, xq, p.m, p.k, write_recip ? h_scale : nullptr,
                                         write_recip ? recip : nullptr));
  } else if (write_recip) {
    reciprocal_kernel<<<1, 1, 0, stream>>>(h_scale, recip);
    DF_RETURN_IF_ERROR(cudaGetLastError());
  }
  const float* d_scale = write_recip ? recip : h_scale_inverse;
  DF_RETURN_IF_ERROR(launch_fp8_gemm<T>(runner, stream, fc1(p), p.x_fp8 ? x : xq, x_scale, w1, w1_scale, b1, h, d_scale, gemm));
  return launch_fp8_gemm<T>(runner, stream, fc2(p), h, h_scale, w2, w2_scale, b2, y, nullptr, gemm);
}

template <typename T>
cudaError_t fp8_mlp_candidates(Fp8GemmActRunner& runner, const Fp8MlpProblem& p, const float* x_scale, const uint8_t* w1,
                               const float* w1_scale, const T* b1, const float* h_scale, const uint8_t* w2, const float* w2_scale,
                               const T* b2, const T* y, int* fc1_count, int* fc2_count) {
  DF_RETURN_IF_ERROR(refusal(p));
  // The launches' plans: X's copy and H in the scratch (nullptr: 256-byte aligned); FC1's D scale, 1/h_scale in the scratch when
  // launched, has h_scale stand in (a plan keeps no pointer: each launch sets its own).
  const int fc1_found = fp8_gemm_candidates<T>(runner, fc1(p), nullptr, x_scale, w1, w1_scale, b1, nullptr, h_scale);
  if (fc1_found < 0) return static_cast<cudaError_t>(-fc1_found);
  const int fc2_found = fp8_gemm_candidates<T>(runner, fc2(p), nullptr, h_scale, w2, w2_scale, b2, y, nullptr);
  if (fc2_found < 0) return static_cast<cudaError_t>(-fc2_found);
  *fc1_count = fc1_found;
  *fc2_count = fc2_found;
  return cudaSuccess;
}

#define DF_INSTANTIATE(T)                                                                                                                  \
  template cudaError_t launch_fp8_mlp<T>(Fp8GemmActRunner&, cudaStream_t, const Fp8MlpProblem&, const void*, const float*, const uint8_t*, \
                                         const float*, const T*, const float*, const uint8_t*, const float*, const T*, T*,                 \
                                         GemmActScratch&, const float*);                                                                   \
  template cudaError_t fp8_mlp_candidates<T>(Fp8GemmActRunner&, const Fp8MlpProblem&, const float*, const uint8_t*, const float*,          \
                                             const T*, const float*, const uint8_t*, const float*, const T*, const T*, int*, int*);
DF_INSTANTIATE(float)
DF_INSTANTIATE(__half)
DF_INSTANTIATE(__nv_bfloat16)
#undef DF_INSTANTIATE

}  // namespace deployfuse
