#include <cmath>

#include "group_norm_act/group_norm_act.h"

namespace deployfuse {

void group_norm_act_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t n, int64_t channels, int64_t spatial,
                        int64_t groups, float epsilon, Act act) {
  const int64_t group_channels = channels / groups, span = group_channels * spatial;
  for (int64_t g = 0; g < n * groups; ++g) {
    const float* in = x + g * span;
    float* out = y + g * span;
    double sum = 0.0, sq = 0.0;
    for (int64_t i = 0; i < span; ++i) sum += in[i];
    const double mean = sum / static_cast<double>(span);
    for (int64_t i = 0; i < span; ++i) sq += (in[i] - mean) * (in[i] - mean);
    const float inv_std = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(span) + epsilon));
    for (int64_t c = 0; c < group_channels; ++c) {
      const int64_t ch = (g % groups) * group_channels + c;
      const float a = scale[ch] * inv_std, b = bias[ch] - static_cast<float>(mean) * a;
      for (int64_t s = 0; s < spatial; ++s) out[c * spatial + s] = apply_act(act, in[c * spatial + s] * a + b);
    }
  }
}

}  // namespace deployfuse
