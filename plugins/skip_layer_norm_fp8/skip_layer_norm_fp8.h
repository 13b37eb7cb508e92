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
    int64_t rows, cols;  // Y, YQ, Sum: [rows, cols], normalised over cols (the last axis)
    bool skip;           // Skip present
    int64_t skip_rows;   // Skip's rows: row r reads Skip[r % skip_rows] (broadcast over the leading axes)
    bool ids;            // Ids present: row r reads X[Ids[r]], X a [table_rows, cols] table
    int64_t table_rows;  // X's rows
    int rank;            // the outputs' dims: X's, or Ids' and cols
    int64_t dims[kMaxRank];
  };
  // From X, Gamma, Beta, Bias, YScale [, Skip [, Ids]] (an absent Skip before Ids: no data); throws std::invalid_argument saying
  // what does not fit.
  Sizes sizes(const Inputs& in) const {
    const Tensor& x = in[0];
    if (x.rank < 1) throw std::invalid_argument("X must have at least one dim");
    Sizes s{};
    s.cols = x.dims[x.rank - 1];
    s.table_rows = x.size(0, x.rank - 1);
    s.skip = in.count() > 5 && in[5].present();
    s.ids = in.count() > 6 && in[6].present();
    if (s.ids) {
      const Tensor& ids = in[6];
      if (x.rank != 2) throw std::invalid_argument("with Ids, X must be a [V, H] table");
      if (ids.rank + 1 > kMaxRank) throw std::invalid_argument("Ids' rank must be below 8");
      if (ids.elements() > 0 && s.table_rows == 0) throw std::invalid_argument("Ids index an empty table");
      s.rank = ids.rank + 1;
      for (int i = 0; i < ids.rank; ++i) s.dims[i] = ids.dims[i];
    } else {
      s.rank = x.rank;
      for (int i = 0; i < x.rank; ++i) s.dims[i] = x.dims[i];
    }
    s.dims[s.rank - 1] = s.cols;
    s.rows = 1;
    for (int i = 0; i + 1 < s.rank; ++i) s.rows *= s.dims[i];
    if (in[1].elements() != s.cols || in[2].elements() != s.cols || in[3].elements() != s.cols)
      throw std::invalid_argument("Gamma, Beta and Bias must have X's last dim");
    if (in[4].elements() != 1) throw std::invalid_argument("YScale must be a scalar (one element)");
    s.skip_rows = s.rows;
    if (s.skip) {
      const Tensor& skip = in[5];
      int lead = 0;  // Skip's leading 1s, then its dims must end the output's
      while (lead < skip.rank - 1 && skip.dims[lead] == 1) ++lead;
      const int n = skip.rank - lead;
      bool fits = n >= 1 && n <= s.rank;
      for (int i = 0; fits && i < n; ++i) fits = skip.dims[lead + i] == s.dims[s.rank - n + i];
      if (!fits) throw std::invalid_argument("Skip must be the output's shape or broadcast to it over its leading axes");
      if (s.cols > 0) s.skip_rows = skip.elements() / s.cols;
    }
    return s;
  }
};

// The table row that id reads: id + rows for id < 0 (Gather's rule), then clamped into [0, rows) (never out of bounds).
#ifdef __CUDACC__
__host__ __device__
#endif
    inline int64_t table_row(int64_t id, int64_t rows) {
  if (id < 0) id += rows;
  return id < 0 ? 0 : id >= rows ? rows - 1 : id;
}

// sum = x[r] [+ skip[r % skip_rows]] + bias, y = LayerNorm(sum) * gamma + beta per row r of cols (two-pass statistics in double),
// yq = e4m3(y / y_scale) (saturating, round to nearest even); with ids, x[r] is row table_row(ids[r], table_rows) of x. skip and ids
// may be null; y, yq, sum each may be null (not written).
void skip_layer_norm_fp8_cpu(const float* x, const float* skip, const int64_t* ids, const float* gamma, const float* beta,
                             const float* bias, float y_scale, float* y, uint8_t* yq, float* sum, int64_t rows, int64_t cols,
                             int64_t skip_rows, int64_t table_rows, float epsilon);

}  // namespace deployfuse
