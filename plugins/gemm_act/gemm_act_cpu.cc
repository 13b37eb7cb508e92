#include <algorithm>

#include "gemm_act/gemm_act.h"

namespace deployfuse {

// Row by row: the row of y starts as bias (zeros for none) (+ residual), then gathers x[i, p] * w[p, :] in the
// order that streams through w's rows (contiguous inner loop the compiler vectorises).
void gemm_act_cpu(const float* x, const float* w, const float* bias, const float* residual, float* y, int64_t m, int64_t n, int64_t k,
                  Act act) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = y + i * n;
    if (bias != nullptr)
      std::copy(bias, bias + n, row);
    else
      std::fill(row, row + n, 0.f);
    if (residual != nullptr)
      for (int64_t j = 0; j < n; ++j) row[j] += residual[i * n + j];
    for (int64_t p = 0; p < k; ++p) {
      const float a = x[i * k + p];
      const float* w_row = w + p * n;
      for (int64_t j = 0; j < n; ++j) row[j] += a * w_row[j];
    }
    for (int64_t j = 0; j < n; ++j) row[j] = apply_act(act, row[j]);
  }
}

}  // namespace deployfuse
