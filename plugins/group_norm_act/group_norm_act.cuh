// GroupNormAct CUDA launcher: Y = act(GroupNorm(X) * scale[c] + bias[c]) on [N, C, spatial].
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "common/activation.h"

namespace deployfuse {

// x, y: [n, channels, spatial]; scale, bias: [channels]; channels % groups == 0.
template <typename T>
cudaError_t launch_group_norm_act(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t n,
                                  int64_t channels, int64_t spatial, int64_t groups, float epsilon, Act act);

}  // namespace deployfuse
