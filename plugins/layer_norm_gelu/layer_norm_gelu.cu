// One block per row: Welford statistics (thread, then warp shuffles, then across warps), then a
// second sweep over the row (served from L1/L2) that normalises and applies GELU in registers.
#include "layer_norm_gelu/layer_norm_gelu.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/activation.h"
#include "common/cuda_check.h"
#include "common/dtype.cuh"

namespace deployfuse {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads) layer_norm_gelu_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                                                                   const T* __restrict__ bias, T* __restrict__ y,
                                                                   int64_t cols, float epsilon, Act act) {
  const T* row = x + blockIdx.x * cols;
  T* out = y + blockIdx.x * cols;
  Welford w;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) w.add(to_float(row[c]));
  float mean, var;
  block_mean_var<kThreads>(w, &mean, &var);
  const float inv_std = rsqrtf(var + epsilon);
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    float v = (to_float(row[c]) - mean) * inv_std * to_float(scale[c]) + to_float(bias[c]);
    out[c] = from_float<T>(apply_act(act, v));
  }
}

}  // namespace

template <typename T>
cudaError_t launch_layer_norm_gelu(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y,
                                   int64_t rows, int64_t cols, float epsilon, bool tanh_approx) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const Act act = tanh_approx ? Act::kGeluTanh : Act::kGelu;
  for (int64_t r0 = 0; r0 < rows; r0 += 0x7fffffff) {  // grid.x limit
    const int64_t n = rows - r0 < 0x7fffffff ? rows - r0 : 0x7fffffff;
    layer_norm_gelu_kernel<T><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x + r0 * cols, scale, bias, y + r0 * cols,
                                                                               cols, epsilon, act);
    DF_RETURN_IF_ERROR(cudaGetLastError());
  }
  return cudaSuccess;
}

template cudaError_t launch_layer_norm_gelu<float>(cudaStream_t, const float*, const float*, const float*, float*, int64_t, int64_t, float, bool);
template cudaError_t launch_layer_norm_gelu<__half>(cudaStream_t, const __half*, const __half*, const __half*, __half*, int64_t, int64_t, float, bool);
template cudaError_t launch_layer_norm_gelu<__nv_bfloat16>(cudaStream_t, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t, int64_t, float, bool);

}  // namespace deployfuse
