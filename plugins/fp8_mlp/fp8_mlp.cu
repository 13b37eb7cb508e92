// Fp8Mlp: X's quantize pass, then Fp8GemmAct's runner twice on problems whose X is already float8 (FC1: X's copy, FC2: H) and,
// for FC1, whose D is float8 (H, scaled by the 1/h_scale the quantize pass wrote). The scratch: [X in float8 | 1/h_scale | H |
// the GEMMs' own scratch], every part 256-byte aligned, the last shared by the two GEMMs (stream-ordered). Each GEMM takes its own
// candidate (algo1, algo2) from its own plan, as Fp8GemmAct's algo.
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

// *recip = 1 / *of: FC1's D scale where no quantize pass writes it (X given in float8).
__global__ void reciprocal_kernel(const float* __restrict__ of, float* __restrict__ recip) { *recip = 1.f / *of; }

}  // namespace

size_t fp8_mlp_scratch_bytes(const Fp8MlpProblem& p, size_t elem_bytes) { return MlpScratch(p, elem_bytes).bytes(); }

template <typename T>
cudaError_t launch_fp8_mlp(Fp8GemmActRunner& runner, cudaStream_t stream, const Fp8MlpProblem& p, const void* x, const float* x_scale,
                           const uint8_t* w1, const float* w1_scale, const T* b1, const float* h_scale, const uint8_t* w2,
                           const float* w2_scale, const T* b2, T* y, GemmActScratch& scratch) {
  DF_RETURN_IF_ERROR(refusal(p));
  if (p.m == 0 || p.n2 == 0) return cudaSuccess;
  const MlpScratch at(p, sizeof(T));
  auto* xq = static_cast<uint8_t*>(scratch.get(at.bytes()));
  if (xq == nullptr) return cudaErrorMemoryAllocation;
  if (reinterpret_cast<uintptr_t>(xq) % kAlign != 0) return cudaErrorInvalidValue;
  auto* recip = reinterpret_cast<float*>(xq + at.xq);
  uint8_t* h = xq + at.xq + at.recip;
  FixedScratch gemm(h + at.h, at.gemm);
  if (p.x_fp8) {
    reciprocal_kernel<<<1, 1, 0, stream>>>(h_scale, recip);
    DF_RETURN_IF_ERROR(cudaGetLastError());
  } else {
    DF_RETURN_IF_ERROR(fp8_quantize_e4m3(stream, static_cast<const T*>(x), x_scale, xq, p.m, p.k, h_scale, recip));
  }
  DF_RETURN_IF_ERROR(launch_fp8_gemm<T>(runner, stream, fc1(p), p.x_fp8 ? x : xq, x_scale, w1, w1_scale, b1, h, recip, gemm));
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
                                         GemmActScratch&);                                                                                 \
  template cudaError_t fp8_mlp_candidates<T>(Fp8GemmActRunner&, const Fp8MlpProblem&, const float*, const uint8_t*, const float*,          \
                                             const T*, const float*, const uint8_t*, const float*, const T*, const T*, int*, int*);
DF_INSTANTIATE(float)
DF_INSTANTIATE(__half)
DF_INSTANTIATE(__nv_bfloat16)
#undef DF_INSTANTIATE

}  // namespace deployfuse
