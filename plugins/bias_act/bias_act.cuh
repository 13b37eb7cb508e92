// BiasAct CUDA launcher: Y = act(X + bias), bias broadcast over the last axis.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "bias_act/bias_act.h"
#include "common/activation.h"

namespace deployfuse {

// x, y: [total / cols, cols]; bias: [cols].
template <typename T>
cudaError_t launch_bias_act(cudaStream_t stream, const T* x, const T* bias, T* y, int64_t total, int64_t cols, Act act);

template <typename T>
cudaError_t run_cuda(const BiasActAttrs& a, const BiasActAttrs::Sizes& s, const Inputs& in, T* y, cudaStream_t stream) {
  return launch_bias_act<T>(stream, in[0].as<T>(), in[1].as<T>(), y, s.total, s.cols, a.act);
}

}  // namespace deployfuse
