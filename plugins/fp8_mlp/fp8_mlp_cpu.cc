#include <vector>

#include "fp8_gemm_act/fp8_gemm_act.h"
#include "fp8_mlp/fp8_mlp.h"

namespace deployfuse {

// Fp8GemmAct's CPU kernel twice: FC1's fp32 output is FC2's X, which FC2 quantizes with h_scale (its XScale).
void fp8_mlp_cpu(const float* x, float x_scale, const uint8_t* w1, float w1_scale, const float* b1, float h_scale, const uint8_t* w2,
                 float w2_scale, const float* b2, float* y, const Fp8MlpAttrs::Sizes& s, Act act) {
  std::vector<float> hidden(static_cast<size_t>(s.m * s.n1));
  fp8_gemm_act_cpu(x, x_scale, w1, w1_scale, b1, hidden.data(), s.m, s.n1, s.k, act);
  fp8_gemm_act_cpu(hidden.data(), h_scale, w2, w2_scale, b2, y, s.m, s.n2, s.n1, Act::kNone);
}

}  // namespace deployfuse
