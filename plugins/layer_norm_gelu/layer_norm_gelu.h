// LayerNormGelu on the host: its attributes (read once, for both runtimes), the sizes of a call
// (for every caller) and the fp32 CPU kernel of the CPU execution provider.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "common/attrs.h"
#include "common/op_inputs.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {

struct LayerNormGeluAttrs {
  using Spec = spec::LayerNormGelu;
  int64_t axis;
  float epsilon;
  bool tanh_approx;
  explicit LayerNormGeluAttrs(const AttrValues& a)
      : axis(a.integer(Spec::kAxis)), epsilon(a.real(Spec::kEpsilon)), tanh_approx(a.text(Spec::kApproximate) == "tanh") {}

  struct Sizes {
    int64_t rows, cols;  // X, Y: [rows, cols], normalised over cols (the dims from axis on)
  };
  Sizes sizes(const Inputs& in) const {
    const Tensor& x = in[0];
    const int64_t a = axis < 0 ? axis + x.rank : axis;
    if (a < 0 || a >= x.rank) throw std::invalid_argument("axis out of range");
    const Sizes s{x.size(0, static_cast<int>(a)), x.size(static_cast<int>(a), x.rank)};
    if (in[1].elements() != s.cols || in[2].elements() != s.cols)
      throw std::invalid_argument("Scale and Bias must have the size of the normalised dims");
    return s;
  }
};

// x, y: [rows, cols]; scale, bias: [cols]. Two-pass mean/variance in double per row.
void layer_norm_gelu_cpu(const float* x, const float* scale, const float* bias, float* y, int64_t rows, int64_t cols, float epsilon,
                         bool tanh_approx);

inline void run_cpu(const LayerNormGeluAttrs& a, const LayerNormGeluAttrs::Sizes& s, const Inputs& in, float* y) {
  layer_norm_gelu_cpu(in[0].as<float>(), in[1].as<float>(), in[2].as<float>(), y, s.rows, s.cols, a.epsilon, a.tanh_approx);
}

}  // namespace deployfuse
