// FusedMHA on the host: its attributes (read once, for both runtimes), the sizes of a call (for
// every caller) and the fp32 CPU kernel of the CPU execution provider.
#pragma once
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "common/attrs.h"
#include "common/mha_shape.h"
#include "common/op_inputs.h"
#include "deployfuse_op_specs.h"
#include "fused_mha/mha_yq.h"

namespace deployfuse {

struct FusedMHAAttrs {
  using Spec = spec::FusedMHA;
  int64_t heads;
  float scale;
  bool causal;
  bool packed;  // packed_qkv: Q, K, V each [batch, seq, 3*hidden]; the op reads Q's first, K's second, V's last third
  explicit FusedMHAAttrs(const AttrValues& a)
      : heads(a.integer(Spec::kNumHeads)),
        scale(a.real(Spec::kScale)),
        causal(a.integer(Spec::kCausal) != 0),
        packed(a.integer(Spec::kPackedQkv) != 0) {
    if (heads <= 0) throw std::invalid_argument("num_heads must be positive");
  }

  using Sizes = MhaShape;  // scale resolved; row strides set; mask strides set when the Mask input is present
  Sizes sizes(const Inputs& in) const {
    const Tensor &q = in[0], &k = in[1], &v = in[2];
    bool same_kv = v.rank == k.rank;
    for (int i = 0; same_kv && i < k.rank; ++i) same_kv = v.dims[i] == k.dims[i];
    if (q.rank != 3 || k.rank != 3 || !same_kv || k.dims[2] != q.dims[2] || k.dims[0] != q.dims[0])
      throw std::invalid_argument(packed ? "packed_qkv: Q, K, V must be [batch, seq, 3*heads*head_dim] with equal last dims"
                                         : "Q, K, V must be [batch, seq, heads*head_dim] with equal hidden sizes");
    if (packed && q.dims[2] % 3 != 0) throw std::invalid_argument("packed_qkv: the last dim of Q, K, V is not 3*hidden");
    const int64_t hidden = packed ? q.dims[2] / 3 : q.dims[2];
    if (hidden % heads != 0) throw std::invalid_argument("hidden size not divisible by num_heads");
    MhaShape s{q.dims[0], q.dims[1], k.dims[1], heads, hidden / heads, scale, causal, {0, 0, 0, 0}, 0, 0, 0};
    set_row_strides(packed, &s);
    if (s.scale == 0.f) s.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
    if (const Tensor* m = mask(in); m && !set_mask_strides(m->dims, m->rank, &s))
      throw std::invalid_argument("Mask is not broadcastable to [batch, heads, q_seq, k_seq]");
    if (const Tensor* ys = y_scale(in); ys && ys->elements() != 1) throw std::invalid_argument("YScale must be a scalar (one element)");
    return s;
  }

  // The Mask (input 3) or null. A node with YScale but no Mask names it "": its adapter hands an input without data over.
  static const Tensor* mask(const Inputs& in) { return in.count() > 3 && in[3].data != nullptr ? &in[3] : nullptr; }
  // YScale (input 4, float32) or null: given, the op writes YQ.
  static const Tensor* y_scale(const Inputs& in) { return in.count() > 4 ? &in[4] : nullptr; }

  // Y's dims, [batch, q_seq, hidden]: Q's, or a third of its width when packed (ONNX Runtime's adapter shapes Y so).
  std::vector<int64_t> y_dims(const MhaShape& s) const { return {s.batch, s.q_seq, s.hidden()}; }

  // Input i's (0 = Q, 1 = K, 2 = V) first element of head 0: its i-th third when packed.
  template <typename T>
  const T* qkv(const Inputs& in, int i, const MhaShape& s) const {
    return in[i].as<T>() + (packed ? i * s.hidden() : 0);
  }
};

// mask may be null. Q, K, V rows are s.q_ld, s.k_ld, s.v_ld elements apart; Y and YQ are [batch, q_seq, hidden]; y and yq.yq
// may each be null (not written).
void fused_mha_cpu(const float* q, const float* k, const float* v, const float* mask, float* y, const MhaShape& s, MhaYq yq);

}  // namespace deployfuse
