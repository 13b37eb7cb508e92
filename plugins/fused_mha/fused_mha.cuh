// FusedMHA CUDA launcher: Y = softmax(Q K^T * scale + mask [+ causal]) V per (batch, head).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "common/mha_shape.h"
#include "fused_mha/fused_mha.h"

namespace deployfuse {

// mask may be null; Q, K, V rows are shape.q_ld, k_ld, v_ld elements apart, Y's (and YQ's) shape.hidden(). head_dim <= 256. T = float,
// __half or __nv_bfloat16 (fp32 math). bias, when not null, is [3 * hidden] = [b_Q | b_K | b_V], the attention then that of
// Q + b_Q, K + b_K and V + b_V (fp8_qkv_bias: the QKV GEMM then runs without its bias epilogue). The tensor-core paths add b_Q
// to Q and b_V to Y, and leave b_K out:
//   (q_i + b_Q) . (k_j + b_K) = (q_i + b_Q) . k_j + c_i,  c_i the same for every key j, and softmax(x + c) = softmax(x);
//   sum_j p_ij (v_j + b_V) = y_i + b_V,  as sum_j p_ij = 1 (a row with every key masked stays 0).
// yq.yq set: every path also writes YQ from Y rounded to T; y may then be null.
template <typename T>
cudaError_t launch_fused_mha(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, const T* bias, T* y,
                             const MhaShape& shape, MhaYq yq = {});

// TensorRT's generic adapter's call: Y only (its FusedMHAOp refuses YScale and Bias; ONNX Runtime's adapter calls the launcher itself).
template <typename T>
cudaError_t run_cuda(const FusedMHAAttrs& op, const MhaShape& s, const Inputs& in, T* y, cudaStream_t stream) {
  if (s.head_dim > 256) throw std::invalid_argument("head_dim > 256 is not supported on CUDA");
  const Tensor* m = FusedMHAAttrs::mask(in);
  return launch_fused_mha<T>(stream, op.qkv<T>(in, 0, s), op.qkv<T>(in, 1, s), op.qkv<T>(in, 2, s), m ? m->as<T>() : nullptr,
                             FusedMHAAttrs::bias_data<T>(in), y, s);
}

}  // namespace deployfuse
