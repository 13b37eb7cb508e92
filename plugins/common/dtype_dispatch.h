// The one dtype dispatch of the host code: every runtime adapter and the C ABI map their element
// type to DType and call a launcher through with_dtype.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace deployfuse {

enum class DType : int { kFloat = 0, kHalf = 1, kBFloat16 = 2, kUnsupported = -1 };  // = the C ABI's dtype codes

// Calls fn with a typed null pointer (float* / __half* / __nv_bfloat16*) selecting the element
// type; cudaErrorInvalidValue for an unsupported one.
template <typename Fn>
cudaError_t with_dtype(DType type, Fn&& fn) {
  switch (type) {
    case DType::kFloat: return fn(static_cast<float*>(nullptr));
    case DType::kHalf: return fn(static_cast<__half*>(nullptr));
    case DType::kBFloat16: return fn(static_cast<__nv_bfloat16*>(nullptr));
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace deployfuse
