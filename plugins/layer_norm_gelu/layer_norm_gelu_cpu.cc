#include <cmath>

#include "common/activation.h"
#include "layer_norm_gelu/layer_norm_gelu.h"

namespace deployfuse {

void layer_norm_gelu_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t rows, int64_t cols, float epsilon,
                         bool tanh_approx) {
  const Act act = tanh_approx ? Act::kGeluTanh : Act::kGelu;
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    float* out = y + r * cols;
    double sum = 0.0, sq = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum += in[c];
    const double mean = sum / static_cast<double>(cols);
    for (int64_t c = 0; c < cols; ++c) sq += (in[c] - mean) * (in[c] - mean);
    const float inv_std = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(cols) + epsilon));
    for (int64_t c = 0; c < cols; ++c) out[c] = apply_act(act, (in[c] - static_cast<float>(mean)) * inv_std * scale[c] + bias[c]);
  }
}

}  // namespace deployfuse
