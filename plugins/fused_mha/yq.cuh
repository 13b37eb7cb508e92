// FusedMHA's float8 output in the kernels' epilogues (MhaYq, fused_mha.h): from y already rounded to T, e4m3(y / scale)
// with a correctly rounded division (the CPU kernel's and the function body's Div; the build keeps -prec-div) and
// saturation, as skip_layer_norm_fp8.cu writes its YQ and Fp8GemmAct's own quantize pass would.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "common/dtype.cuh"

namespace deployfuse {

template <typename T>
__device__ __forceinline__ uint8_t e4m3_of(T y, float scale) {
  return __nv_cvt_float_to_fp8(to_float(y) / scale, __NV_SATFINITE, __NV_E4M3);
}

// Elements a, b (adjacent in a row) as two float8 bytes, a's first.
template <typename T>
__device__ __forceinline__ uint16_t e4m3_pair(T a, T b, float scale) {
  return __nv_cvt_float2_to_fp8x2(make_float2(to_float(a) / scale, to_float(b) / scale), __NV_SATFINITE, __NV_E4M3);
}

}  // namespace deployfuse
