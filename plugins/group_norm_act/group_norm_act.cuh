// GroupNormAct CUDA launcher: Y = act(GroupNorm(X) * scale[c] + bias[c]) on [N, C, spatial].
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/activation.h"
#include "group_norm_act/group_norm_act.h"

namespace deployfuse {

// x, y: [n, channels, spatial]; scale, bias: [channels]; channels % groups == 0.
template <typename T>
cudaError_t launch_group_norm_act(cudaStream_t stream, const T* x, const T* scale, const T* bias, T* y, int64_t n, int64_t channels,
                                  int64_t spatial, int64_t groups, float epsilon, Act act);

template <typename T>
cudaError_t run_cuda(const GroupNormActAttrs& a, const GroupNormActAttrs::Sizes& s, const Inputs& in, T* y, cudaStream_t stream) {
  return launch_group_norm_act<T>(stream, in[0].as<T>(), in[1].as<T>(), in[2].as<T>(), y, s.n, s.channels, s.spatial, a.groups, a.epsilon,
                                  a.act);
}

}  // namespace deployfuse
