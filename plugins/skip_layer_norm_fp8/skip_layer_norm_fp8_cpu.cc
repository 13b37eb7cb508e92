#include <cmath>
#include <vector>

#include "fp8_gemm_act/fp8_gemm_act.h"  // e4m3_from_float: Fp8GemmAct's quantizer, which YQ replaces
#include "skip_layer_norm_fp8/skip_layer_norm_fp8.h"

namespace deployfuse {

void skip_layer_norm_fp8_cpu(const float* x, const float* skip, const int64_t* ids, const float* gamma, const float* beta,
                             const float* bias, float y_scale, float* y, uint8_t* yq, float* sum, int64_t rows, int64_t cols,
                             int64_t skip_rows, int64_t table_rows, float epsilon) {
  std::vector<float> total(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = r * cols;
    const float* xr = x + (ids ? table_row(ids[r], table_rows) : r) * cols;
    const float* sr = skip ? skip + (r % skip_rows) * cols : nullptr;
    double mean = 0.0, sq = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      total[c] = xr[c] + bias[c] + (sr ? sr[c] : 0.f);
      mean += total[c];
    }
    mean /= static_cast<double>(cols);
    for (int64_t c = 0; c < cols; ++c) sq += (total[c] - mean) * (total[c] - mean);
    const float rstd = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(cols) + epsilon));
    for (int64_t c = 0; c < cols; ++c) {
      const float v = (total[c] - static_cast<float>(mean)) * rstd * gamma[c] + beta[c];
      if (y) y[at + c] = v;
      if (yq) yq[at + c] = e4m3_from_float(v / y_scale);
      if (sum) sum[at + c] = total[c];
    }
  }
}

}  // namespace deployfuse
