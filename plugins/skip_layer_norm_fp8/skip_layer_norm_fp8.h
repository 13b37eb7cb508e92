// SkipLayerNormFp8 on the host: its attributes, the sizes of a call (the shape checks, for every caller) and the fp32 CPU
// kernel of the CPU execution provider.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "common/attrs.h"
#include "common/op_inputs.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {

struct SkipLayerNormFp8Attrs {
  using Spec = spec::SkipLayerNormFp8;
  float epsilon;
  explicit SkipLayerNormFp8Attrs(const AttrValues& a) : epsilon(a.real(Spec::kEpsilon)) {}

  struct Sizes {
    int64_t rows, cols;  // X, Skip, Y, YQ, Sum: [rows, cols], normalised over cols (the last axis)
    bool skip;           // Skip present
  };
  // From X, Gamma, Beta, Bias, YScale [, Skip]; throws std::invalid_argument saying what does not fit.
  Sizes sizes(const Inputs& in) const {
    const Tensor& x = in[0];
    if (x.rank < 1) throw std::invalid_argument("X must have at least one dim");
    const Sizes s{x.size(0, x.rank - 1), x.dims[x.rank - 1], in.count() > 5};
    if (in[1].elements() != s.cols || in[2].elements() != s.cols || in[3].elements() != s.cols)
      throw std::invalid_argument("Gamma, Beta and Bias must have X's last dim");
    if (in[4].elements() != 1) throw std::invalid_argument("YScale must be a scalar (one element)");
    if (s.skip && in[5].elements() != x.elements()) throw std::invalid_argument("Skip must have X's shape");
    return s;
  }
};

// sum = x [+ skip] + bias, y = LayerNorm(sum) * gamma + beta per row of cols (two-pass statistics in double), yq = e4m3(y / y_scale)
// (saturating, round to nearest even). skip may be null; y, yq, sum each may be null (not written).
void skip_layer_norm_fp8_cpu(const float* x, const float* skip, const float* gamma, const float* beta, const float* bias, float y_scale,
                             float* y, uint8_t* yq, float* sum, int64_t rows, int64_t cols, float epsilon);

}  // namespace deployfuse
