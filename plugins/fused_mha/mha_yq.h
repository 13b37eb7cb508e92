// FusedMHA's float8 output, for every kernel (the Hopper one builds without the generated spec header fused_mha.h needs).
#pragma once
#include <cstdint>

namespace deployfuse {

// YQ = e4m3(Y as rounded to T / *scale) (saturating, round to nearest even: what the fp8 GEMM reading it would compute
// from Y), written beside Y, or alone (Y null), when yq is set. scale points where the kernel runs (device memory for
// the CUDA launchers).
struct MhaYq {
  const float* scale = nullptr;
  uint8_t* yq = nullptr;
};

}  // namespace deployfuse
