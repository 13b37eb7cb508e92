// One block per (sample, group): the group is contiguous (C/G channels x spatial), so the
// statistics are a Welford reduction over one span and the affine + activation a second sweep.
#include "group_norm_act/group_norm_act.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/cuda_check.h"
#include "common/dtype.cuh"

namespace deployfuse {
namespace {

constexpr int kThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kThreads) group_norm_act_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                                                                  const T* __restrict__ bias, T* __restrict__ y,
                                                                  int64_t group_channels, int64_t spatial, int64_t groups,
                                                                  float epsilon, Act act) {
  const int64_t span = group_channels * spatial;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * span;
  const int64_t first_channel = (blockIdx.x % groups) * group_channels;
  Welford w;
  for (int64_t i = threadIdx.x; i < span; i += kThreads) w.add(to_float(x[base + i]));
  float mean, var;
  block_mean_var<kThreads>(w, &mean, &var);
  const float inv_std = rsqrtf(var + epsilon);
  for (int64_t c = 0; c < group_channels; ++c) {
    const float a = to_float(scale[first_channel + c]) * inv_std;
    const float b = to_float(bias[first_channel + c]) - mean * a;
    const int64_t off = base + c * spatial;
    for (int64_t s = threadIdx.x; s < spatial; s += kThreads) y[off + s] = from_float<T>(apply_act(act, to_float(x[off + s]) * a + b));
  }
}

}  // namespace

template <typename T>
cudaError_t launch_group_norm_act(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t n,
                                  int64_t channels, int64_t spatial, int64_t groups, float epsilon, Act act) {
  if (n == 0 || channels == 0 || spatial == 0) return cudaSuccess;
  if (groups <= 0 || channels % groups != 0) return cudaErrorInvalidValue;
  group_norm_act_kernel<T><<<static_cast<unsigned>(n * groups), kThreads, 0, stream>>>(x, scale, bias, y, channels / groups, spatial,
                                                                                       groups, epsilon, act);
  return cudaGetLastError();
}

template cudaError_t launch_group_norm_act<float>(cudaStream_t, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, float, Act);
template cudaError_t launch_group_norm_act<__half>(cudaStream_t, const __half*, const __half*, const __half*, __half*, int64_t, int64_t, int64_t, int64_t, float, Act);
template cudaError_t launch_group_norm_act<__nv_bfloat16>(cudaStream_t, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t, int64_t, int64_t, int64_t, float, Act);

}  // namespace deployfuse
