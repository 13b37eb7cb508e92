// FusedMHA CUDA launcher: Y = softmax(Q K^T * scale + mask [+ causal]) V per (batch, head).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "common/mha_shape.h"
#include "fused_mha/fused_mha.h"

namespace deployfuse {

// mask may be null; Q, K, V rows are shape.q_ld, k_ld, v_ld elements apart, Y's (and YQ's) shape.hidden(). head_dim <= 256. T = float,
// __half or __nv_bfloat16 (fp32 math). yq.yq set: every path also writes YQ from Y rounded to T; y may then be null.
template <typename T>
cudaError_t launch_fused_mha(cudaStream_t stream, const T* q, const T* k, const T* v, const T* mask, T* y, const MhaShape& shape,
                             MhaYq yq = {});

// TensorRT's generic adapter's call: Y only (its FusedMHAOp refuses YScale; ONNX Runtime's adapter calls the launcher itself).
template <typename T>
cudaError_t run_cuda(const FusedMHAAttrs& op, const MhaShape& s, const Inputs& in, T* y, cudaStream_t stream) {
  if (s.head_dim > 256) throw std::invalid_argument("head_dim > 256 is not supported on CUDA");
  const Tensor* m = FusedMHAAttrs::mask(in);
  return launch_fused_mha<T>(stream, op.qkv<T>(in, 0, s), op.qkv<T>(in, 1, s), op.qkv<T>(in, 2, s), m ? m->as<T>() : nullptr, y, s);
}

}  // namespace deployfuse
