// fp32 CPU kernels behind the CPU execution provider (and the reference for native tests).
#pragma once
#include <cstdint>

#include "common/activation.h"

namespace deployfuse {

// x, y: [rows, cols]; scale, bias: [cols]. Two-pass mean/variance in double per row.
void layer_norm_gelu_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t rows, int64_t cols,
                         float epsilon, bool tanh_approx);
// x, y: [n, channels, spatial]; scale, bias: [channels].
void group_norm_act_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t n, int64_t channels,
                        int64_t spatial, int64_t groups, float epsilon, Act act);
// x, y: [total / cols, cols]; bias: [cols].
void bias_act_cpu(const float* x, const float* bias, float* y, int64_t total, int64_t cols, Act act);

}  // namespace deployfuse
