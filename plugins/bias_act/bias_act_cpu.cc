#include "bias_act/bias_act.h"

namespace deployfuse {

void bias_act_cpu(const float* x, const float* bias, float* y, int64_t total, int64_t cols, Act act) {
  for (int64_t r = 0; r < total; r += cols) {
    for (int64_t c = 0; c < cols; ++c) y[r + c] = apply_act(act, x[r + c] + bias[c]);
  }
}

}  // namespace deployfuse
