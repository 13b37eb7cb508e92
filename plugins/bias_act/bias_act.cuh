// BiasAct CUDA launcher: Y = act(X + bias), bias broadcast over the last axis.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "common/activation.h"

namespace deployfuse {

// x, y: [total / cols, cols]; bias: [cols].
template <typename T>
cudaError_t launch_bias_act(cudaStream_t stream, const T* x, const T* bias, T* y, int64_t total, int64_t cols, Act act);

}  // namespace deployfuse
