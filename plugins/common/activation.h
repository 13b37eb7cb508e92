// Activations shared by the CPU and CUDA kernels; names match the ONNX attributes.
#pragma once
#include <cmath>
#include <cstring>

#if defined(__CUDACC__)
#define DF_HD __host__ __device__ __forceinline__
#else
#define DF_HD inline
#endif

namespace deployfuse {

enum class Act : int { kNone = 0, kRelu, kGelu, kGeluTanh, kSilu, kSigmoid };

// Parses an activation attribute; returns false for an unknown name.
inline bool parse_act(const char* name, Act* out) {
  static const struct { const char* name; Act act; } kTable[] = {
      {"none", Act::kNone}, {"relu", Act::kRelu}, {"gelu", Act::kGelu},
      {"gelu_tanh", Act::kGeluTanh}, {"silu", Act::kSilu}, {"sigmoid", Act::kSigmoid}};
  for (const auto& e : kTable) {
    if (std::strcmp(name, e.name) == 0) { *out = e.act; return true; }
  }
  return false;
}

// gelu(x) = 0.5 x (1 + erf(x / sqrt 2)); tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
DF_HD float apply_act(Act act, float x) {
  switch (act) {
    case Act::kRelu: return x > 0.f ? x : 0.f;
    case Act::kGelu: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case Act::kGeluTanh: return 0.5f * x * (1.f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case Act::kSilu: return x / (1.f + expf(-x));
    case Act::kSigmoid: return 1.f / (1.f + expf(-x));
    default: return x;
  }
}

}  // namespace deployfuse
