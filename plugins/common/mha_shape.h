// Sizes and options of one FusedMHA call, shared by the CPU kernel and the CUDA launcher.
#pragma once
#include <cstdint>

namespace deployfuse {

struct MhaShape {
  int64_t batch, q_seq, k_seq, heads, head_dim;  // Q: [batch, q_seq, heads*head_dim]; K, V: [batch, k_seq, ...]
  float scale;                                   // already resolved (never 0)
  bool causal;                                   // key j > query i masked (top-left aligned)
  int64_t mask_stride[4];                        // element strides of the additive mask over [b, h, q, k]; 0 = broadcast
};

// fp32 CPU kernel; mask may be null.
void fused_mha_cpu(const float* q, const float* k, const float* v, const float* mask, float* y, const MhaShape& s);

}  // namespace deployfuse
