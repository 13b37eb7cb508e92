// Sizes and options of one FusedMHA call, shared by the CPU kernel and the CUDA launcher.
#pragma once
#include <cstdint>

namespace deployfuse {

struct MhaShape {
  int64_t batch, q_seq, k_seq, heads, head_dim;        // Q: [batch, q_seq, heads*head_dim]; K, V: [batch, k_seq, ...]
  float scale;                                         // already resolved (never 0)
  bool causal;                                         // key j > query i masked (top-left aligned)
  int64_t mask_stride[4];                              // element strides of the additive mask over [b, h, q, k]; 0 = broadcast
  int64_t q_ld, k_ld, v_ld;                            // elements between consecutive sequence positions of Q, K, V
                                                       // (heads*head_dim, or 3x that when they sit in one packed [Q | K | V])
  int64_t hidden() const { return heads * head_dim; }  // Y's row: Y is always [batch, q_seq, hidden] (host code)
};

// Sets Q, K and V's row strides: each its own [.., hidden] tensor, or the thirds of one packed [.., 3*hidden] row.
inline void set_row_strides(bool packed, MhaShape* s) { s->q_ld = s->k_ld = s->v_ld = (packed ? 3 : 1) * s->hidden(); }

// Sets s->mask_stride for a contiguous additive mask of `rank` dims, right-aligned and broadcast
// to [batch, heads, q_seq, k_seq]; false when it is not broadcastable (or rank > 4).
inline bool set_mask_strides(const int64_t* dims, int rank, MhaShape* s) {
  if (rank > 4) return false;
  const int64_t full[4] = {s->batch, s->heads, s->q_seq, s->k_seq};
  int64_t stride = 1;
  for (int i = 3, j = rank - 1; i >= 0; --i, --j) {
    const int64_t dim = j >= 0 ? dims[j] : 1;
    if (dim != 1 && dim != full[i]) return false;
    s->mask_stride[i] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
  return true;
}

}  // namespace deployfuse
