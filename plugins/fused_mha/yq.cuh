// FusedMHA's float8 output in the kernels' epilogues (MhaYq, fused_mha.h): from y already rounded to T, e4m3(y / scale)
// correctly rounded (the CPU kernel's and the function body's Div; the build keeps -prec-div; a multiply where the scale is a
// power of two, E4m3Divisor) and saturated, as skip_layer_norm_fp8.cu writes its YQ and Fp8GemmAct's own quantize pass would.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "common/dtype.cuh"
#include "common/e4m3_divisor.cuh"

namespace deployfuse {

template <typename T>
__device__ __forceinline__ uint8_t e4m3_of(T y, const E4m3Divisor& scale) {
  return __nv_cvt_float_to_fp8(scale.divide(to_float(y)), __NV_SATFINITE, __NV_E4M3);
}

// Elements a, b (adjacent in a row) as two float8 bytes, a's first.
template <typename T>
__device__ __forceinline__ uint16_t e4m3_pair(T a, T b, const E4m3Divisor& scale) {
  return __nv_cvt_float2_to_fp8x2(scale.divide(to_float(a), to_float(b)), __NV_SATFINITE, __NV_E4M3);
}

}  // namespace deployfuse
