// Fp8GemmAct on cuBLASLt. X is quantized into float8e4m3fn scratch by one kernel (16 elements a thread: one 16-byte store of fp8,
// 1/x_scale read from the device once per thread, so q(x) = e4m3(x · (1/s)), which differs from e4m3(x / s) only where x / s lies
// within an fp32 ulp of a rounding midpoint), then one fp8 GEMM. Row-major Y = Xq Wᵀ is column-major Yᵀ = W Xqᵀ: cuBLASLt gets
// A = W stored k x n (ld k) with op T, B = Xq stored k x m (ld k), D = Y (n x m, ld n) — the "TN" layout its fp8 kernels want — and
// computes D = epilogue(w_scale · x_scale · (A B) + bias) with fp32 accumulation; C is D with beta = 0.
#include <cuda_fp8.h>

#include <tuple>

#include "common/cublaslt.cuh"
#include "common/cuda_check.h"
#include "common/dtype.cuh"
#include "fp8_gemm_act/fp8_gemm_act.cuh"

namespace deployfuse {
namespace {

constexpr int kPerThread = 16;  // elements quantized by one thread: 16 bytes of fp8 out
constexpr int kThreads = 256;
constexpr size_t kScratchAlign = 256;

size_t scratch_aligned(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// D's leading dimension: n, or n rounded up to 16 bytes of T where n·sizeof(T) is not a multiple of 16 (cuBLASLt's fp8 kernels
// want 16-byte aligned rows; D then goes to scratch and is copied into Y).
int64_t d_ld(int64_t n, size_t elem_bytes) {
  const auto per16 = static_cast<int64_t>(16 / elem_bytes);
  return (n + per16 - 1) / per16 * per16;
}

// The scratch of one launch: X in float8, D when it is padded (d_ld), then the algorithm's workspace.
struct ScratchLayout {
  size_t xq, d;
  ScratchLayout(int64_t m, int64_t n, int64_t k, size_t elem_bytes)
      : xq(scratch_aligned(static_cast<size_t>(m * k))),
        d(d_ld(n, elem_bytes) == n ? 0 : scratch_aligned(static_cast<size_t>(m * d_ld(n, elem_bytes)) * elem_bytes)) {}
};

// q[i] = e4m3(x[i] / scale) for i < groups * 16; x and q 16-byte aligned.
template <typename T>
__global__ void quantize_e4m3_vec(const T* __restrict__ x, const float* __restrict__ scale, uint8_t* __restrict__ q, int64_t groups) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const float inv = 1.f / __ldg(scale);
  constexpr int kLoads = kPerThread * sizeof(T) / 16;
  Vec<T> in[kLoads];
  const auto* src = reinterpret_cast<const Vec<T>*>(x) + g * kLoads;
#pragma unroll
  for (int l = 0; l < kLoads; ++l) in[l] = src[l];
  alignas(16) __nv_fp8x2_storage_t out[kPerThread / 2];
#pragma unroll
  for (int e = 0; e < kPerThread; e += 2) {
    const T* v = &in[e / Vec<T>::kSize].v[e % Vec<T>::kSize];
    out[e / 2] = __nv_cvt_float2_to_fp8x2(make_float2(to_float(v[0]) * inv, to_float(v[1]) * inv), __NV_SATFINITE, __NV_E4M3);
  }
  reinterpret_cast<uint4*>(q)[g] = *reinterpret_cast<const uint4*>(out);
}

// The same one element a thread, for X off 16-byte alignment.
template <typename T>
__global__ void quantize_e4m3_scalar(const T* __restrict__ x, const float* __restrict__ scale, uint8_t* __restrict__ q, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) q[i] = __nv_cvt_float_to_fp8(to_float(x[i]) * (1.f / __ldg(scale)), __NV_SATFINITE, __NV_E4M3);
}

template <typename T>
cudaError_t quantize_e4m3(cudaStream_t stream, const T* x, const float* scale, uint8_t* q, int64_t count) {
  if (count % kPerThread == 0 && aligned16(x) && aligned16(q)) {
    const int64_t groups = count / kPerThread;
    quantize_e4m3_vec<T><<<static_cast<unsigned>((groups + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, scale, q, groups);
  } else {
    quantize_e4m3_scalar<T><<<static_cast<unsigned>((count + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, scale, q, count);
  }
  return cudaGetLastError();
}

using Plan = cublaslt::Plan<kGemmActCandidates>;
// dtype, m, n, k, epilogue, alignments of W, Bias, D (X's float8 copy is always kScratchAlign-aligned; a padded D too)
using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int, uint32_t, uint32_t, uint32_t>;

}  // namespace

class Fp8GemmActRunner {
 public:
  // The plan of the problem (made on first use); null with *err set when there is none.
  template <typename T>
  const Plan* plan(const Fp8GemmActProblem& p, const float* x_scale, const uint8_t* w, const float* w_scale, const T* bias, const T* y,
                   cudaError_t* err) {
    cublasLtEpilogue_t epi;
    if (p.k <= 0 || p.k % kFp8GemmActKMultiple != 0 || !cublaslt::bias_epilogue(p.act, &epi)) {
      *err = cudaErrorInvalidValue;
      return nullptr;
    }
    const int64_t ldd = d_ld(p.n, sizeof(T));
    const uint32_t d_align = ldd == p.n ? cublaslt::alignment(y) : kScratchAlign;
    const uint32_t aligns[4] = {cublaslt::alignment(w), kScratchAlign, d_align, d_align};
    const cudaDataType_t type = cublaslt::data_type<T>();
    const PlanKey key{static_cast<int>(type), p.m, p.n, p.k, static_cast<int>(epi), aligns[0], cublaslt::alignment(bias), aligns[3]};
    return plans_.find(
        key,
        [&](Plan& plan, cublasLtHandle_t handle) {
          const int32_t bias_type = type;
          return plan.create(CUBLAS_COMPUTE_32F, {CUDA_R_8F_E4M3, p.k, p.n, p.k}, {CUDA_R_8F_E4M3, p.k, p.m, p.k}, {type, p.n, p.m, ldd}) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale) &&
                 cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scale) &&
                 plan.query(handle, kGemmActWorkspaceBytes, aligns);
        },
        err);
  }

  template <typename T>
  cudaError_t launch(cudaStream_t stream, const Fp8GemmActProblem& p, const T* x, const float* x_scale, const uint8_t* w,
                     const float* w_scale, const T* bias, T* y, GemmActScratch& scratch) {
    if (p.m == 0 || p.n == 0) return cudaSuccess;
    const auto plan_of = [&](cudaError_t* err) { return plan(p, x_scale, w, w_scale, bias, y, err); };
    return plans_.with_plan(plan_of, [&](const Plan& plan) {
      const ScratchLayout at(p.m, p.n, p.k, sizeof(T));
      const size_t workspace_bytes = plan.candidate(p.algo).workspaceSize;
      auto* buffer = static_cast<uint8_t*>(scratch.get(at.xq + at.d + workspace_bytes));
      if (buffer == nullptr) return cudaErrorMemoryAllocation;
      DF_RETURN_IF_ERROR(quantize_e4m3(stream, x, x_scale, buffer, p.m * p.k));
      if (!cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias) ||  // this call's pointers
          !cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale) ||
          !cublaslt::set(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scale))
        return cudaErrorInvalidValue;
      T* d = at.d ? reinterpret_cast<T*>(buffer + at.xq) : y;
      DF_RETURN_IF_ERROR(
          plan.matmul(plans_.handle(), p.algo, w, buffer, 0.f, d, d, workspace_bytes ? buffer + at.xq + at.d : nullptr, stream));
      if (d == y) return cudaSuccess;
      const size_t row = static_cast<size_t>(p.n) * sizeof(T);
      return cudaMemcpy2DAsync(y, row, d, static_cast<size_t>(d_ld(p.n, sizeof(T))) * sizeof(T), row, static_cast<size_t>(p.m),
                               cudaMemcpyDeviceToDevice, stream);
    });
  }

  template <typename T>
  int candidates(const Fp8GemmActProblem& p, const float* x_scale, const uint8_t* w, const float* w_scale, const T* bias, const T* y) {
    return plans_.candidates([&](cudaError_t* err) { return plan(p, x_scale, w, w_scale, bias, y, err); });
  }

 private:
  cublaslt::Plans<PlanKey, Plan> plans_;
};

size_t fp8_gemm_act_scratch_bytes(int64_t m, int64_t n, int64_t k, size_t elem_bytes) {
  const ScratchLayout at(m, n, k, elem_bytes);
  return at.xq + at.d + kGemmActWorkspaceBytes;
}

std::shared_ptr<Fp8GemmActRunner> make_fp8_gemm_act_runner() { return std::make_shared<Fp8GemmActRunner>(); }

template <typename T>
cudaError_t launch_fp8_gemm_act(Fp8GemmActRunner& runner, cudaStream_t stream, const Fp8GemmActProblem& p, const T* x, const float* x_scale,
                                const uint8_t* w, const float* w_scale, const T* bias, T* y, GemmActScratch& scratch) {
  return runner.launch(stream, p, x, x_scale, w, w_scale, bias, y, scratch);
}

template <typename T>
int fp8_gemm_act_candidates(Fp8GemmActRunner& runner, const Fp8GemmActProblem& p, const float* x_scale, const uint8_t* w,
                            const float* w_scale, const T* bias, const T* y) {
  return runner.candidates(p, x_scale, w, w_scale, bias, y);
}

#define DF_INSTANTIATE(T)                                                                                                          \
  template cudaError_t launch_fp8_gemm_act<T>(Fp8GemmActRunner&, cudaStream_t, const Fp8GemmActProblem&, const T*, const float*,   \
                                              const uint8_t*, const float*, const T*, T*, GemmActScratch&);                        \
  template int fp8_gemm_act_candidates<T>(Fp8GemmActRunner&, const Fp8GemmActProblem&, const float*, const uint8_t*, const float*, \
                                          const T*, const T*);
DF_INSTANTIATE(float)
DF_INSTANTIATE(__half)
DF_INSTANTIATE(__nv_bfloat16)
#undef DF_INSTANTIATE

}  // namespace deployfuse
