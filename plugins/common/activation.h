// Activations shared by the CPU and CUDA kernels; names match the ONNX attributes.
#pragma once
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#if defined(__CUDACC__)
#define DF_HD __host__ __device__ __forceinline__
#else
#define DF_HD inline
#endif

namespace deployfuse {

enum class Act : int { kNone = 0, kRelu, kGelu, kGeluTanh, kSilu, kSigmoid };

// Parses an activation attribute; returns false for an unknown name.
inline bool parse_act(const char* name, Act* out) {
  static const struct {
    const char* name;
    Act act;
  } kTable[] = {{"none", Act::kNone},          {"relu", Act::kRelu}, {"gelu", Act::kGelu},
                {"gelu_tanh", Act::kGeluTanh}, {"silu", Act::kSilu}, {"sigmoid", Act::kSigmoid}};
  for (const auto& e : kTable) {
    if (std::strcmp(name, e.name) == 0) {
      *out = e.act;
      return true;
    }
  }
  return false;
}

// The Act of an attribute value (the op's spec has already checked it is one of its choices).
inline Act act_named(const std::string& name) {
  Act act;
  if (!parse_act(name.c_str(), &act)) throw std::invalid_argument("unknown activation '" + name + "'");
  return act;
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

#if defined(__CUDACC__)
// The same activations with fast intrinsics, for the CUDA kernels of 16-byte vectors (where the
// fp32 libm calls, not memory, would set the pace). erf by Abramowitz & Stegun 7.1.26 (absolute
// error <= 1.5e-7): erf(a) = 1 - t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) e^(-a^2), t = 1 / (1 + p a);
// tanh-GELU as x * sigmoid(2u) = x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3).
__device__ __forceinline__ float erf_fast(float x) {
  const float a = fabsf(x);
  const float t = __fdividef(1.f, fmaf(0.3275911f, a, 1.f));
  const float poly = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 1.061405429f, -1.453152027f), 1.421413741f), -0.284496736f), 0.254829592f);
  return copysignf(1.f - poly * __expf(-a * a), x);
}

template <Act kAct>
__device__ __forceinline__ float act_fast(float x) {
  if constexpr (kAct == Act::kRelu) return fmaxf(x, 0.f);
  if constexpr (kAct == Act::kGelu) return 0.5f * x * (1.f + erf_fast(x * 0.70710678118654752f));
  if constexpr (kAct == Act::kGeluTanh) return __fdividef(x, 1.f + __expf(-1.5957691216057308f * fmaf(0.044715f * x, x * x, x)));
  if constexpr (kAct == Act::kSilu) return __fdividef(x, 1.f + __expf(-x));
  if constexpr (kAct == Act::kSigmoid) return __fdividef(1.f, 1.f + __expf(-x));
  return x;
}

// Calls fn(std::integral_constant<Act, a>) for the runtime value act (kernels templated on it).
template <typename Fn>
auto with_act(Act act, Fn&& fn) {
  switch (act) {
    case Act::kRelu: return fn(std::integral_constant<Act, Act::kRelu>());
    case Act::kGelu: return fn(std::integral_constant<Act, Act::kGelu>());
    case Act::kGeluTanh: return fn(std::integral_constant<Act, Act::kGeluTanh>());
    case Act::kSilu: return fn(std::integral_constant<Act, Act::kSilu>());
    case Act::kSigmoid: return fn(std::integral_constant<Act, Act::kSigmoid>());
    default: return fn(std::integral_constant<Act, Act::kNone>());
  }
}
#endif

}  // namespace deployfuse
