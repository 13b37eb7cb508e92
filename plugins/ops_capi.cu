// A C ABI over the CUDA launchers (raw device pointers, dtype code 0=fp32 1=fp16 2=bf16), so the
// GPU checks and benchmarks can drive the kernels from Python (ctypes + torch tensors).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "bias_act/bias_act.cuh"
#include "fused_mha/fused_mha.cuh"
#include "group_norm_act/group_norm_act.cuh"
#include "layer_norm_gelu/layer_norm_gelu.cuh"

namespace {
template <typename Fn>
int by_dtype(int dtype, Fn&& fn) {
  switch (dtype) {
    case 0: return fn(static_cast<float*>(nullptr));
    case 1: return fn(static_cast<__half*>(nullptr));
    case 2: return fn(static_cast<__nv_bfloat16*>(nullptr));
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}
}  // namespace

#define DF_EXPORT extern "C" __attribute__((visibility("default")))
using namespace deployfuse;

DF_EXPORT int df_layer_norm_gelu(int dtype, void* stream, const void* x, const void* scale, const void* bias, void* y, int64_t rows,
                                 int64_t cols, float eps, int tanh_approx) {
  return by_dtype(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return static_cast<int>(launch_layer_norm_gelu<T>(static_cast<cudaStream_t>(stream), static_cast<const T*>(x), static_cast<const T*>(scale),
                                                      static_cast<const T*>(bias), static_cast<T*>(y), rows, cols, eps, tanh_approx != 0));
  });
}

DF_EXPORT int df_group_norm_act(int dtype, void* stream, const void* x, const void* scale, const void* bias, void* y, int64_t n,
                                int64_t channels, int64_t spatial, int64_t groups, float eps, int act) {
  return by_dtype(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return static_cast<int>(launch_group_norm_act<T>(static_cast<cudaStream_t>(stream), static_cast<const T*>(x), static_cast<const T*>(scale),
                                                     static_cast<const T*>(bias), static_cast<T*>(y), n, channels, spatial, groups, eps,
                                                     static_cast<Act>(act)));
  });
}

DF_EXPORT int df_bias_act(int dtype, void* stream, const void* x, const void* bias, void* y, int64_t total, int64_t cols, int act) {
  return by_dtype(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return static_cast<int>(launch_bias_act<T>(static_cast<cudaStream_t>(stream), static_cast<const T*>(x), static_cast<const T*>(bias),
                                               static_cast<T*>(y), total, cols, static_cast<Act>(act)));
  });
}

DF_EXPORT int df_fused_mha(int dtype, void* stream, const void* q, const void* k, const void* v, const void* mask, void* y,
                           const MhaShape* shape) {
  return by_dtype(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return static_cast<int>(launch_fused_mha<T>(static_cast<cudaStream_t>(stream), static_cast<const T*>(q), static_cast<const T*>(k),
                                                static_cast<const T*>(v), static_cast<const T*>(mask), static_cast<T*>(y), *shape));
  });
}
