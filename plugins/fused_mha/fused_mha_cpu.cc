// Per (batch, head, query): scores over all keys, a max-subtracted softmax, then P V.
#include <cmath>
#include <limits>
#include <vector>

#include "fp8_gemm_act/fp8_gemm_act.h"  // e4m3_from_float: Fp8GemmAct's quantizer, which YQ replaces
#include "fused_mha/fused_mha.h"

namespace deployfuse {

void fused_mha_cpu(const float* q, const float* k, const float* v, const float* mask, float* y, const MhaShape& s, MhaYq yq) {
  const int64_t row = s.hidden();  // Y's
  std::vector<float> p(static_cast<size_t>(s.k_seq)), y_row(static_cast<size_t>(s.head_dim));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.q_seq; ++i) {
        const float* qr = q + (b * s.q_seq + i) * s.q_ld + h * s.head_dim;
        float max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < s.k_seq; ++j) {
          float score = -std::numeric_limits<float>::infinity();
          if (!(s.causal && j > i)) {
            const float* kr = k + (b * s.k_seq + j) * s.k_ld + h * s.head_dim;
            float dot = 0.f;
            for (int64_t c = 0; c < s.head_dim; ++c) dot += qr[c] * kr[c];
            score = dot * s.scale;
            if (mask) score += mask[b * s.mask_stride[0] + h * s.mask_stride[1] + i * s.mask_stride[2] + j * s.mask_stride[3]];
          }
          p[j] = score;
          max = std::fmax(max, score);
        }
        float sum = 0.f;
        for (int64_t j = 0; j < s.k_seq; ++j) sum += (p[j] = max == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(p[j] - max));
        const int64_t at = (b * s.q_seq + i) * row + h * s.head_dim;
        float* out = y ? y + at : y_row.data();
        for (int64_t c = 0; c < s.head_dim; ++c) out[c] = 0.f;
        for (int64_t j = 0; j < s.k_seq; ++j) {
          const float* vr = v + (b * s.k_seq + j) * s.v_ld + h * s.head_dim;
          const float w = sum > 0.f ? p[j] / sum : 0.f;
          for (int64_t c = 0; c < s.head_dim; ++c) out[c] += w * vr[c];
        }
        if (yq.yq)
          for (int64_t c = 0; c < s.head_dim; ++c) yq.yq[at + c] = e4m3_from_float(out[c] / *yq.scale);
      }
}

}  // namespace deployfuse
