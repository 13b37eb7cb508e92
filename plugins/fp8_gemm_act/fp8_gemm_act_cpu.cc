#include <cmath>
#include <cstring>
#include <vector>

#include "fp8_gemm_act/fp8_gemm_act.h"
#include "gemm_act/gemm_act.h"

namespace deployfuse {

uint8_t e4m3_from_float(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const float a = std::fabs(v);
  if (std::isnan(v)) return sign | 0x7Fu;
  if (a >= 448.f) return sign | 0x7Eu;  // saturate (and every value below 448 rounds to at most 448)
  if (a < 0.015625f) {                  // below 2^-6: subnormal steps of 2^-9 (a * 512 is exact), 8 steps = the smallest normal
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.f));
  }
  // Normal: keep 3 of fp32's 23 mantissa bits, rounding the 20 dropped ones to nearest even (a carry
  // into the exponent is right: the value rounded up to the next power of two).
  uint32_t mag = bits & 0x7FFFFFFFu;
  mag += 0x7FFFFu + ((mag >> 20) & 1u);
  const uint32_t exponent = (mag >> 23) - 127u + 7u, mantissa = (mag >> 20) & 7u;
  return sign | static_cast<uint8_t>(exponent << 3 | mantissa);
}

float e4m3_to_float(uint8_t v) {
  const int exponent = (v >> 3) & 15, mantissa = v & 7;
  float mag;
  if (exponent == 15 && mantissa == 7) {
    mag = NAN;
  } else {
    mag = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9) : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  }
  return (v & 0x80) ? -mag : mag;
}

// Dequantizes both operands into fp32 (X rounded through e4m3 first; W transposed to [k, n]) and
// runs GemmAct's CPU kernel on them: the same float32 products and sums as the ONNX function body's
// Div -> Cast to float8 (saturate) -> Cast back -> Mul -> MatMul.
void fp8_gemm_act_cpu(const float* x, float x_scale, const uint8_t* w, float w_scale, const float* bias, float* y, int64_t m, int64_t n,
                      int64_t k, Act act) {
  float decoded[256];
  for (int v = 0; v < 256; ++v) decoded[v] = e4m3_to_float(static_cast<uint8_t>(v));
  std::vector<float> xd(static_cast<size_t>(m * k)), wd(static_cast<size_t>(k * n));
  for (int64_t i = 0; i < m * k; ++i) xd[i] = decoded[e4m3_from_float(x[i] / x_scale)] * x_scale;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t p = 0; p < k; ++p) wd[p * n + j] = decoded[w[j * k + p]] * w_scale;
  gemm_act_cpu(xd.data(), wd.data(), bias, nullptr, y, m, n, k, act);
}

}  // namespace deployfuse
