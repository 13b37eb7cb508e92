// LayerNormGelu fp32 CPU kernel (the CPU execution provider's).
#pragma once
#include <cstdint>

namespace deployfuse {

// x, y: [rows, cols]; scale, bias: [cols]. Two-pass mean/variance in double per row.
void layer_norm_gelu_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t rows, int64_t cols, float epsilon,
                         bool tanh_approx);

}  // namespace deployfuse
