// A C ABI over the CUDA launchers (raw device pointers, dtype code 0=fp32 1=fp16 2=bf16), so the
// GPU checks and benchmarks can drive the kernels from Python (ctypes + torch tensors).
#include "bias_act/bias_act.cuh"
#include "common/dtype_dispatch.h"
#include "fused_mha/fused_mha.cuh"
#include "group_norm_act/group_norm_act.cuh"
#include "layer_norm_gelu/layer_norm_gelu.cuh"

namespace {
// fn(T* tag) -> cudaError_t in the dtype the code names, as an int.
template <typename Fn>
int by_dtype(int dtype, Fn&& fn) {
  return static_cast<int>(deployfuse::with_dtype(static_cast<deployfuse::DType>(dtype), fn));
}
}  // namespace

#define DF_EXPORT extern "C" __attribute__((visibility("default")))
using namespace deployfuse;

DF_EXPORT int df_layer_norm_gelu(int dtype, void* stream, const void* x, const void* scale, const void* bias, void* y, int64_t rows,
                                 int64_t cols, float eps, int tanh_approx) {
  return by_dtype(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return launch_layer_norm_gelu<T>(static_cast<cudaStream_t>(stream), static_cast<const T*>(x), static_cast<const T*>(scale),
                                     static_cast<const T*>(bias), static_cast<T*>(y), rows, cols, eps, tanh_approx != 0);
  });
}

DF_EXPORT int df_group_norm_act(int dtype, void* stream, const void* x, const void* scale, const void* bias, void* y, int64_t n,
                                int64_t channels, int64_t spatial, int64_t groups, float eps, int act) {
  return by_dtype(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return launch_group_norm_act<T>(static_cast<cudaStream_t>(stream), static_cast<const T*>(x), static_cast<const T*>(scale),
                                    static_cast<const T*>(bias), static_cast<T*>(y), n, channels, spatial, groups, eps,
                                    static_cast<Act>(act));
  });
}

DF_EXPORT int df_bias_act(int dtype, void* stream, const void* x, const void* bias, void* y, int64_t total, int64_t cols, int act) {
  return by_dtype(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return launch_bias_act<T>(static_cast<cudaStream_t>(stream), static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(y),
                              total, cols, static_cast<Act>(act));
  });
}

DF_EXPORT int df_fused_mha(int dtype, void* stream, const void* q, const void* k, const void* v, const void* mask, void* y,
                           const MhaShape* shape) {
  return by_dtype(dtype, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return launch_fused_mha<T>(static_cast<cudaStream_t>(stream), static_cast<const T*>(q), static_cast<const T*>(k),
                               static_cast<const T*>(v), static_cast<const T*>(mask), static_cast<T*>(y), *shape);
  });
}
