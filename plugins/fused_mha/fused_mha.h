// FusedMHA on the host: its attributes (read once, for both runtimes), the sizes of a call (for
// every caller) and the fp32 CPU kernel of the CPU execution provider.
#pragma once
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "common/attrs.h"
#include "common/mha_shape.h"
#include "common/op_inputs.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {

struct FusedMHAAttrs {
  using Spec = spec::FusedMHA;
  int64_t heads;
  float scale;
  bool causal;
  explicit FusedMHAAttrs(const AttrValues& a)
      : heads(a.integer(Spec::kNumHeads)), scale(a.real(Spec::kScale)), causal(a.integer(Spec::kCausal) != 0) {
    if (heads <= 0) throw std::invalid_argument("num_heads must be positive");
  }

  using Sizes = MhaShape;  // scale resolved; mask strides set when the Mask input is present
  Sizes sizes(const Inputs& in) const {
    const Tensor &q = in[0], &k = in[1], &v = in[2];
    bool same_kv = v.rank == k.rank;
    for (int i = 0; same_kv && i < k.rank; ++i) same_kv = v.dims[i] == k.dims[i];
    if (q.rank != 3 || k.rank != 3 || !same_kv || k.dims[2] != q.dims[2] || k.dims[0] != q.dims[0])
      throw std::invalid_argument("Q, K, V must be [batch, seq, heads*head_dim] with equal hidden sizes");
    if (q.dims[2] % heads != 0) throw std::invalid_argument("hidden size not divisible by num_heads");
    MhaShape s{q.dims[0], q.dims[1], k.dims[1], heads, q.dims[2] / heads, scale, causal, {0, 0, 0, 0}};
    if (s.scale == 0.f) s.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
    if (in.count() > 3 && !set_mask_strides(in[3].dims, in[3].rank, &s))
      throw std::invalid_argument("Mask is not broadcastable to [batch, heads, q_seq, k_seq]");
    return s;
  }
};

// mask may be null.
void fused_mha_cpu(const float* q, const float* k, const float* v, const float* mask, float* y, const MhaShape& s);

inline void run_cpu(const FusedMHAAttrs&, const MhaShape& s, const Inputs& in, float* y) {
  fused_mha_cpu(in[0].as<float>(), in[1].as<float>(), in[2].as<float>(), in.count() > 3 ? in[3].as<float>() : nullptr, y, s);
}

}  // namespace deployfuse
