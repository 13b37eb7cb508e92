// Fp8GemmAct on cuBLASLt. X is quantized into float8e4m3fn scratch by one kernel (16 elements a thread: one 16-byte store of fp8;
// q(x) = e4m3(x / s) correctly rounded, a multiply by 1/s where s is a power of two, E4m3Divisor: the reciprocal it used before
// moved a value within an fp32 ulp of a rounding midpoint to the other float8, rel L2 3.97e-3 on one draw of bench/fp8_gemm_gpu.py's
// ORT check), then one fp8 GEMM. Row-major Y = Xq Wᵀ is column-major Yᵀ = W Xqᵀ: cuBLASLt gets
// A = W stored k x n (ld k) with op T, B = Xq stored k x m (ld k), D = Y (n x m, ld n) — the "TN" layout its fp8 kernels want — and
// computes D = epilogue(w_scale · x_scale · (A B) + bias) with fp32 accumulation (or the GPU's faster, coarser one: fast_accum);
// C is D with beta = 0. cuBLASLt's fp8 kernels want every dimension of 16 bytes (cuBLAS docs, cublasLtMatmul's fp8 requirements:
// "the optimal requirements listed in Tensor Core Usage", (k · 1) % 16 for A and B, (rows of D · sizeof(T)) % 16 for C and D —
// the rows themselves, not only the leading dimension): where K or N does not fit, padded copies in the scratch stand in
// (ScratchLayout) and the GEMM computes np >= n output columns whose extra ones are dropped by the copy into Y.
// Two problem options: X given in float8 (no quantize pass, no copy of X: Fp8Mlp's GEMMs, and Fp8GemmAct / Fp8Mlp fed
// SkipLayerNormFp8's YQ), and D in float8 (Fp8Mlp's FC1; cuBLASLt's FP8 output:
// D type CUDA_R_8F_E4M3 with C and the bias in fp16/bf16, the one combination its fp8 kernels take for an fp8 D, and
// CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, by which cuBLASLt multiplies the epilogue's result before rounding it to e4m3).
#include <cuda_fp8.h>

#include <tuple>

#include "common/cublaslt.cuh"
#include "common/cuda_check.h"
#include "common/dtype.cuh"
#include "common/e4m3_divisor.cuh"
#include "common/env_flag.h"
#include "fp8_gemm_act/fp8_gemm_act.cuh"

namespace deployfuse {
namespace {

constexpr int kPerThread = 16;  // elements quantized by one thread: 16 bytes of fp8 out
constexpr int kThreads = 256;
constexpr uint32_t kScratchAlign = 256;  // bytes; each part of the scratch starts at a multiple

size_t scratch_aligned(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// The workspace cuBLASLt's fp8 algorithms may use: none. On the H200 every candidate offered with one
// (32 MiB) issued a memset a call at BERT's 8192 tokens for the QKV GEMM and Fp8Mlp's FC1 (24 a
// model call, each with ~1.4 us of idle time before it in a CUDA graph); without one cuBLASLt offers
// statically scheduled kernels ("ssched") that issue none and ran faster there (QKV 0.0269 against
// 0.0283 ms at the fastest candidate, memsets included: bench/results/gemm_memsets_workspace_h200.log).
// DEPLOYFUSE_FP8_GEMM_WORKSPACE=1 allows it again, for benchmarks to compare.
uint64_t fp8_workspace_bytes() {
  static const uint64_t bytes = env_flag("DEPLOYFUSE_FP8_GEMM_WORKSPACE", false) ? static_cast<uint64_t>(kGemmActWorkspaceBytes) : 0;
  return bytes;
}

// N rounded up to 16 bytes of T: the output columns the GEMM computes (cuBLASLt's fp8 kernels want D's rows of 16 bytes).
int64_t n_padded(int64_t n, size_t elem_bytes) {
  const auto per16 = static_cast<int64_t>(16 / elem_bytes);
  return (n + per16 - 1) / per16 * per16;
}

// The scratch of one launch, in this order: X in float8 as [m, kp] (none when given in float8); W copied to [np, kp] where K is not a
// multiple of 16 or N not of 16 bytes of T (zeros past K add nothing to the products; the rows past N make the dropped columns); the bias
// copied to [np] and D as [m, np] where N is padded; the workspace.
// has_bias false: no room for a padded bias copy (an empty bias runs no bias epilogue); the size queries assume a bias (the most).
struct ScratchLayout {
  int64_t kp, np;          // K rounded up to 16, N to 16 bytes of T
  size_t xq, wq, bias, d;  // bytes of each part, 0 for a part not needed (W, Bias and Y used as given)
  ScratchLayout(const Fp8GemmActProblem& p, size_t elem_bytes, bool has_bias = true)
      : kp(fp8_gemm_act_k_padded(p.k)),
        np(n_padded(p.n, p.d_fp8 ? 1 : elem_bytes)),
        xq(p.x_fp8 ? 0 : scratch_aligned(static_cast<size_t>(p.m * kp))),
        wq(kp == p.k && np == p.n ? 0 : scratch_aligned(static_cast<size_t>(np * kp))),
        bias(np == p.n || !has_bias ? 0 : scratch_aligned(static_cast<size_t>(np) * elem_bytes)),
        d(np == p.n ? 0 : scratch_aligned(static_cast<size_t>(p.m * np) * elem_bytes)) {}
  size_t bytes(size_t workspace) const { return xq + wq + bias + d + workspace; }
};

// q[i] = e4m3(x[i] / scale) for i < groups * 16; x and q 16-byte aligned.
template <typename T>
__global__ void quantize_e4m3_vec(const T* __restrict__ x, const float* __restrict__ scale, uint8_t* __restrict__ q, int64_t groups,
                                  const float* __restrict__ recip_of, float* __restrict__ recip) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  if (recip != nullptr && g == 0) *recip = 1.f / *recip_of;
  const E4m3Divisor by(__ldg(scale));
  constexpr int kLoads = kPerThread * sizeof(T) / 16;
  Vec<T> in[kLoads];
  const auto* src = reinterpret_cast<const Vec<T>*>(x) + g * kLoads;
#pragma unroll
  for (int l = 0; l < kLoads; ++l) in[l] = src[l];
  alignas(16) __nv_fp8x2_storage_t out[kPerThread / 2];
#pragma unroll
  for (int e = 0; e < kPerThread; e += 2) {
    const T* v = &in[e / Vec<T>::kSize].v[e % Vec<T>::kSize];
    out[e / 2] = __nv_cvt_float2_to_fp8x2(by.divide(to_float(v[0]), to_float(v[1])), __NV_SATFINITE, __NV_E4M3);
  }
  reinterpret_cast<uint4*>(q)[g] = *reinterpret_cast<const uint4*>(out);
}

// The same one element a thread into rows of kp bytes, zeros past k: for X off 16-byte alignment or K not a multiple of 16.
template <typename T>
__global__ void quantize_e4m3_rows(const T* __restrict__ x, const float* __restrict__ scale, uint8_t* __restrict__ q, int64_t k, int64_t kp,
                                   int64_t count, const float* __restrict__ recip_of, float* __restrict__ recip) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  if (recip != nullptr && i == 0) *recip = 1.f / *recip_of;
  const int64_t row = i / kp, col = i - row * kp;
  q[i] = col < k ? __nv_cvt_float_to_fp8(E4m3Divisor(__ldg(scale)).divide(to_float(x[row * k + col])), __NV_SATFINITE, __NV_E4M3) : 0;
}

using Plan = cublaslt::Plan<kGemmActCandidates>;
// dtype, m, n, k, epilogue, fast accumulation, X given in float8, D in float8, alignments of W, X, Bias, D (the copies in the
// scratch are kScratchAlign-aligned)
using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int, int, bool, bool, uint32_t, uint32_t, uint32_t, uint32_t>;

}  // namespace

template <typename T>
cudaError_t fp8_quantize_e4m3(cudaStream_t stream, const T* x, const float* scale, uint8_t* q, int64_t m, int64_t k, const float* recip_of,
                              float* recip) {
  const int64_t kp = fp8_gemm_act_k_padded(k);
  if (m == 0 || kp == 0) return cudaSuccess;
  if (kp == k && (m * k) % kPerThread == 0 && aligned16(x) && aligned16(q)) {
    const int64_t groups = m * k / kPerThread;
    quantize_e4m3_vec<T>
        <<<static_cast<unsigned>((groups + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, scale, q, groups, recip_of, recip);
  } else {
    const int64_t count = m * kp;
    quantize_e4m3_rows<T>
        <<<static_cast<unsigned>((count + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, scale, q, k, kp, count, recip_of, recip);
  }
  return cudaGetLastError();
}

class Fp8GemmActRunner {
 public:
  // The plan of the problem (made on first use); null with *err set when there is none.
  template <typename T>
  const Plan* plan(const Fp8GemmActProblem& p, const void* x, const float* x_scale, const uint8_t* w, const float* w_scale, const T* bias,
                   const void* y, const float* d_scale, cudaError_t* err) {
    cublasLtEpilogue_t epi;
    if (p.k <= 0 || !cublaslt::epilogue(p.act, bias != nullptr, &epi) || (p.d_fp8 && d_scale == nullptr)) {
      *err = cudaErrorInvalidValue;
      return nullptr;
    }
    if (p.d_fp8 && p.n % kFp8GemmActKMultiple != 0) {  // rows of a float8 D in 16 bytes: no padded copy for it
      *err = cudaErrorNotSupported;
      return nullptr;
    }
    const ScratchLayout at(p, sizeof(T), bias != nullptr);
    const uint32_t d_align = at.d ? kScratchAlign : cublaslt::alignment(y);
    const uint32_t aligns[4] = {at.wq ? kScratchAlign : cublaslt::alignment(w), p.x_fp8 ? cublaslt::alignment(x) : kScratchAlign, d_align,
                                d_align};
    const uint32_t bias_align = at.bias || bias == nullptr ? kScratchAlign : cublaslt::alignment(bias);
    const cudaDataType_t type = cublaslt::data_type<T>();
    const int8_t fast_accum = p.fast_accum ? 1 : 0;
    const PlanKey key{static_cast<int>(type),
                      p.m,
                      p.n,
                      p.k,
                      static_cast<int>(epi),
                      fast_accum,
                      p.x_fp8,
                      p.d_fp8,
                      aligns[0],
                      aligns[1],
                      bias_align,
                      aligns[3]};
    return plans_.find(
        key,
        [&](Plan& plan, cublasLtHandle_t handle) {
          const int32_t bias_type = type;
          const Plan::Layout c_layout{type, at.np, p.m, at.np};  // a float8 D's C: T, as the bias (beta = 0: never read)
          return plan.create(CUBLAS_COMPUTE_32F, {CUDA_R_8F_E4M3, at.kp, at.np, at.kp}, {CUDA_R_8F_E4M3, at.kp, p.m, at.kp},
                             {p.d_fp8 ? CUDA_R_8F_E4M3 : type, at.np, p.m, at.np}, p.d_fp8 ? &c_layout : nullptr) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi) &&
                 (bias == nullptr || (cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type) &&
                                      cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias))) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scale) &&
                 (!p.d_fp8 || cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, d_scale)) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum) && plan.query(handle, fp8_workspace_bytes(), aligns);
        },
        p.algo, err);
  }

  template <typename T>
  cudaError_t launch(cudaStream_t stream, const Fp8GemmActProblem& p, const void* x, const float* x_scale, const uint8_t* w,
                     const float* w_scale, const T* bias, void* y, const float* d_scale, GemmActScratch& scratch) {
    if (p.m == 0 || p.n == 0) return cudaSuccess;
    const auto plan_of = [&](cudaError_t* err) { return plan(p, x, x_scale, w, w_scale, bias, y, d_scale, err); };
    return plans_.with_plan(plan_of, [&](const Plan& plan) {
      const ScratchLayout at(p, sizeof(T), bias != nullptr);
      const size_t workspace_bytes = plan.candidate(p.algo).workspaceSize, bytes = at.bytes(workspace_bytes);
      auto* xq = bytes ? static_cast<uint8_t*>(scratch.get(bytes)) : nullptr;  // X given in float8 and no workspace: none
      if (bytes && xq == nullptr) return cudaErrorMemoryAllocation;
      if (bytes && cublaslt::alignment(xq) < kScratchAlign) return cudaErrorInvalidValue;  // the plan took every part as aligned
      uint8_t *wq = xq + at.xq, *bias_copy = wq + at.wq, *d_copy = bias_copy + at.bias, *workspace = d_copy + at.d;
      if (!p.x_fp8) DF_RETURN_IF_ERROR(fp8_quantize_e4m3(stream, static_cast<const T*>(x), x_scale, xq, p.m, p.k));
      if (at.wq) {  // W [n, k] into [np, kp]: zeros past k and in the rows past n
        DF_RETURN_IF_ERROR(cudaMemcpy2DAsync(wq, at.kp, w, p.k, p.k, p.n, cudaMemcpyDeviceToDevice, stream));
        if (at.kp > p.k) DF_RETURN_IF_ERROR(cudaMemset2DAsync(wq + p.k, at.kp, 0, at.kp - p.k, p.n, stream));
        if (at.np > p.n) DF_RETURN_IF_ERROR(cudaMemsetAsync(wq + p.n * at.kp, 0, (at.np - p.n) * at.kp, stream));
      }
      const size_t row = static_cast<size_t>(p.n) * sizeof(T), padded_row = static_cast<size_t>(at.np) * sizeof(T);
      if (at.bias) {  // the epilogue reads np bias values: the given n, zeros past them
        DF_RETURN_IF_ERROR(cudaMemcpyAsync(bias_copy, bias, row, cudaMemcpyDeviceToDevice, stream));
        DF_RETURN_IF_ERROR(cudaMemsetAsync(bias_copy + row, 0, padded_row - row, stream));
      }
      if ((bias != nullptr &&
           !cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, at.bias ? reinterpret_cast<const T*>(bias_copy) : bias)) ||
          !cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale) ||  // this call's pointers
          !cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scale) ||
          (p.d_fp8 && !cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, d_scale)))
        return cudaErrorInvalidValue;
      void* d = at.d ? d_copy : y;  // never a copy for a float8 D (n a multiple of 16)
      // C (beta = 0: never read) is D, but no pointer for a float8 D, whose C layout is not D's (no in-place aliasing)
      DF_RETURN_IF_ERROR(plan.matmul(plans_.handle(), p.algo, at.wq ? wq : w, p.x_fp8 ? x : xq, 0.f, p.d_fp8 ? nullptr : d, d,
                                     workspace_bytes ? workspace : nullptr, stream));
      if (d == y) return cudaSuccess;
      return cudaMemcpy2DAsync(y, row, d, padded_row, row, static_cast<size_t>(p.m), cudaMemcpyDeviceToDevice, stream);
    });
  }

  template <typename T>
  int candidates(const Fp8GemmActProblem& p, const void* x, const float* x_scale, const uint8_t* w, const float* w_scale, const T* bias,
                 const void* y, const float* d_scale) {
    Fp8GemmActProblem all = p;
    all.algo = cublaslt::kAllCandidates;
    return plans_.candidates([&](cudaError_t* err) { return plan(all, x, x_scale, w, w_scale, bias, y, d_scale, err); });
  }

 private:
  cublaslt::Plans<PlanKey, Plan> plans_;
};

size_t fp8_gemm_scratch_bytes(const Fp8GemmActProblem& p, size_t elem_bytes) {
  return ScratchLayout(p, elem_bytes).bytes(fp8_workspace_bytes());
}

size_t fp8_gemm_act_scratch_bytes(int64_t m, int64_t n, int64_t k, size_t elem_bytes) {
  return fp8_gemm_scratch_bytes(Fp8GemmActProblem{m, n, k, Act::kNone, -1}, elem_bytes);
}

std::shared_ptr<Fp8GemmActRunner> make_fp8_gemm_act_runner() { return std::make_shared<Fp8GemmActRunner>(); }

template <typename T>
cudaError_t launch_fp8_gemm_act(Fp8GemmActRunner& runner, cudaStream_t stream, const Fp8GemmActProblem& p, const void* x,
                                const float* x_scale, const uint8_t* w, const float* w_scale, const T* bias, T* y,
                                GemmActScratch& scratch) {
  return runner.launch<T>(stream, p, x, x_scale, w, w_scale, bias, y, nullptr, scratch);
}

template <typename T>
cudaError_t launch_fp8_gemm(Fp8GemmActRunner& runner, cudaStream_t stream, const Fp8GemmActProblem& p, const void* x, const float* x_scale,
                            const uint8_t* w, const float* w_scale, const T* bias, void* y, const float* d_scale, GemmActScratch& scratch) {
  return runner.launch<T>(stream, p, x, x_scale, w, w_scale, bias, y, d_scale, scratch);
}

template <typename T>
int fp8_gemm_act_candidates(Fp8GemmActRunner& runner, const Fp8GemmActProblem& p, const float* x_scale, const uint8_t* w,
                            const float* w_scale, const T* bias, const T* y) {
  return runner.candidates<T>(p, nullptr, x_scale, w, w_scale, bias, y, nullptr);
}

template <typename T>
int fp8_gemm_candidates(Fp8GemmActRunner& runner, const Fp8GemmActProblem& p, const void* x, const float* x_scale, const uint8_t* w,
                        const float* w_scale, const T* bias, const void* y, const float* d_scale) {
  return runner.candidates<T>(p, x, x_scale, w, w_scale, bias, y, d_scale);
}

#define DF_INSTANTIATE(T)                                                                                                            \
  template cudaError_t fp8_quantize_e4m3<T>(cudaStream_t, const T*, const float*, uint8_t*, int64_t, int64_t, const float*, float*); \
  template cudaError_t launch_fp8_gemm<T>(Fp8GemmActRunner&, cudaStream_t, const Fp8GemmActProblem&, const void*, const float*,      \
                                          const uint8_t*, const float*, const T*, void*, const float*, GemmActScratch&);             \
  template cudaError_t launch_fp8_gemm_act<T>(Fp8GemmActRunner&, cudaStream_t, const Fp8GemmActProblem&, const void*, const float*,  \
                                              const uint8_t*, const float*, const T*, T*, GemmActScratch&);                          \
  template int fp8_gemm_act_candidates<T>(Fp8GemmActRunner&, const Fp8GemmActProblem&, const float*, const uint8_t*, const float*,   \
                                          const T*, const T*);                                                                       \
  template int fp8_gemm_candidates<T>(Fp8GemmActRunner&, const Fp8GemmActProblem&, const void*, const float*, const uint8_t*,        \
                                      const float*, const T*, const void*, const float*);
DF_INSTANTIATE(float)
DF_INSTANTIATE(__half)
DF_INSTANTIATE(__nv_bfloat16)
#undef DF_INSTANTIATE

}  // namespace deployfuse
