// libdeployfuse_trt: the TensorRT IPluginV3 plugins. Thin adapters turn TensorRT tensor
// descriptions and plugin fields into calls of the CUDA launchers (the same ones behind the ONNX
// Runtime library); kCreators at the bottom is the one list of what is registered. Names = the
// ONNX op types, namespace "deployfuse" (the ONNX domain), version "1", so TensorRT's ONNX
// parser maps `deployfuse.*` nodes to them. Loaded with IPluginRegistry::loadLibrary, which in
// TensorRT 10 and TensorRT-RTX alike needs the two entry points at the bottom: `setLoggerFinder`
// and `getCreators`.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>

#include "bias_act/bias_act.cuh"
#include "common/activation.h"
#include "common/mha_shape.h"
#include "common/trt_plugin.h"
#include "fused_mha/fused_mha.cuh"
#include "group_norm_act/group_norm_act.cuh"
#include "layer_norm_gelu/layer_norm_gelu.cuh"

namespace deployfuse {
namespace trt {
namespace {

constexpr auto kInt = PluginFieldType::kINT32;
constexpr auto kFloat = PluginFieldType::kFLOAT32;
constexpr auto kText = PluginFieldType::kCHAR;

// Calls fn with a typed null pointer selecting float / __half / __nv_bfloat16.
template <typename Fn>
cudaError_t dispatch(DataType type, Fn&& fn) {
  switch (type) {
    case DataType::kFLOAT: return fn(static_cast<float*>(nullptr));
    case DataType::kHALF: return fn(static_cast<__half*>(nullptr));
    case DataType::kBF16: return fn(static_cast<__nv_bfloat16*>(nullptr));
    default: return cudaErrorInvalidValue;
  }
}

Act parse_activation(const std::string& name, std::initializer_list<Act> allowed) {
  Act act;
  if (parse_act(name.c_str(), &act)) {
    for (Act a : allowed)
      if (a == act) return act;
  }
  throw std::invalid_argument("unsupported activation '" + name + "'");
}

// ----------------------------------------------------------------------------- LayerNormGelu
struct LayerNormGeluOp {
  static constexpr const char* kName = "LayerNormGelu";
  static constexpr int32_t kMinInputs = 3, kMaxInputs = 3;
  static constexpr FieldSpec kFields[] = {{"axis", kInt, -1, nullptr, false},
                                          {"epsilon", kFloat, 1e-5, nullptr, false},
                                          {"approximate", kText, 0, "none", false}};
  int64_t axis;
  float epsilon;
  bool tanh_approx;
  explicit LayerNormGeluOp(const Fields& f) : axis(f.integer(0)), epsilon(f.real(1)), tanh_approx(f.text(2) == "tanh") {
    if (f.text(2) != "none" && f.text(2) != "tanh") throw std::invalid_argument("approximate must be 'none' or 'tanh'");
  }
  cudaError_t enqueue(DataType type, const PluginTensorDesc* in, int32_t, const void* const* inputs, void* y, cudaStream_t stream) const {
    const int32_t rank = in[0].dims.nbDims;
    const int32_t a = static_cast<int32_t>(axis < 0 ? axis + rank : axis);
    if (a < 0 || a >= rank) return cudaErrorInvalidValue;
    const int64_t rows = volume(in[0].dims, 0, a), cols = volume(in[0].dims, a, rank);
    return dispatch(type, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_layer_norm_gelu<T>(stream, static_cast<const T*>(inputs[0]), static_cast<const T*>(inputs[1]),
                                       static_cast<const T*>(inputs[2]), static_cast<T*>(y), rows, cols, epsilon, tanh_approx);
    });
  }
};

// ----------------------------------------------------------------------------- GroupNormAct
struct GroupNormActOp {
  static constexpr const char* kName = "GroupNormAct";
  static constexpr int32_t kMinInputs = 3, kMaxInputs = 3;
  static constexpr FieldSpec kFields[] = {{"num_groups", kInt, 0, nullptr, true},
                                          {"epsilon", kFloat, 1e-5, nullptr, false},
                                          {"activation", kText, 0, "silu", false}};
  int64_t groups;
  float epsilon;
  Act act;
  explicit GroupNormActOp(const Fields& f)
      : groups(f.integer(0)), epsilon(f.real(1)), act(parse_activation(f.text(2), {Act::kSilu, Act::kGelu, Act::kNone})) {
    if (groups <= 0) throw std::invalid_argument("num_groups must be positive");
  }
  cudaError_t enqueue(DataType type, const PluginTensorDesc* in, int32_t, const void* const* inputs, void* y, cudaStream_t stream) const {
    const nvinfer1::Dims& d = in[0].dims;
    if (d.nbDims < 2 || d.d[1] % groups != 0) return cudaErrorInvalidValue;
    return dispatch(type, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_group_norm_act<T>(stream, static_cast<const T*>(inputs[0]), static_cast<const T*>(inputs[1]),
                                      static_cast<const T*>(inputs[2]), static_cast<T*>(y), d.d[0], d.d[1], volume(d, 2, d.nbDims),
                                      groups, epsilon, act);
    });
  }
};

// ----------------------------------------------------------------------------- BiasAct
struct BiasActOp {
  static constexpr const char* kName = "BiasAct";
  static constexpr int32_t kMinInputs = 2, kMaxInputs = 2;
  static constexpr FieldSpec kFields[] = {{"activation", kText, 0, "gelu", false}};
  Act act;
  explicit BiasActOp(const Fields& f)
      : act(parse_activation(f.text(0), {Act::kRelu, Act::kGelu, Act::kGeluTanh, Act::kSilu, Act::kSigmoid})) {}
  cudaError_t enqueue(DataType type, const PluginTensorDesc* in, int32_t, const void* const* inputs, void* y, cudaStream_t stream) const {
    const nvinfer1::Dims& d = in[0].dims;
    const int64_t total = volume(d, 0, d.nbDims), cols = d.nbDims == 0 ? 1 : d.d[d.nbDims - 1];
    return dispatch(type, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_bias_act<T>(stream, static_cast<const T*>(inputs[0]), static_cast<const T*>(inputs[1]), static_cast<T*>(y), total,
                                cols, act);
    });
  }
};

// ----------------------------------------------------------------------------- FusedMHA
struct FusedMHAOp {
  static constexpr const char* kName = "FusedMHA";
  static constexpr int32_t kMinInputs = 3, kMaxInputs = 4;
  static constexpr FieldSpec kFields[] = {{"num_heads", kInt, 0, nullptr, true},
                                          {"scale", kFloat, 0.0, nullptr, false},
                                          {"causal", kInt, 0, nullptr, false}};
  int64_t heads;
  float scale;
  bool causal;
  explicit FusedMHAOp(const Fields& f) : heads(f.integer(0)), scale(f.real(1)), causal(f.integer(2) != 0) {
    if (heads <= 0) throw std::invalid_argument("num_heads must be positive");
    if (f.integer(2) != 0 && f.integer(2) != 1) throw std::invalid_argument("causal must be 0 or 1");
  }
  cudaError_t enqueue(DataType type, const PluginTensorDesc* in, int32_t nb_in, const void* const* inputs, void* y,
                      cudaStream_t stream) const {
    const nvinfer1::Dims &q = in[0].dims, &k = in[1].dims;
    if (q.nbDims != 3 || k.nbDims != 3 || q.d[2] != k.d[2] || q.d[0] != k.d[0] || q.d[2] % heads != 0) return cudaErrorInvalidValue;
    MhaShape s{q.d[0], q.d[1], k.d[1], heads, q.d[2] / heads, scale, causal, {0, 0, 0, 0}};
    if (s.scale == 0.f) s.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
    const void* mask = nb_in > 3 ? inputs[3] : nullptr;
    if (mask != nullptr && !set_mask_strides(in[3].dims.d, in[3].dims.nbDims, &s)) return cudaErrorInvalidValue;
    return dispatch(type, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_fused_mha<T>(stream, static_cast<const T*>(inputs[0]), static_cast<const T*>(inputs[1]),
                                 static_cast<const T*>(inputs[2]), static_cast<const T*>(mask), static_cast<T*>(y), s);
    });
  }
};

}  // namespace
}  // namespace trt
}  // namespace deployfuse

extern "C" __attribute__((visibility("default"))) void setLoggerFinder(nvinfer1::ILoggerFinder* finder) {
  deployfuse::trt::g_logger_finder = finder;
}

// The one registration list.
extern "C" __attribute__((visibility("default"))) nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
  using namespace deployfuse::trt;
  static Creator<LayerNormGeluOp> layer_norm_gelu;
  static Creator<GroupNormActOp> group_norm_act;
  static Creator<BiasActOp> bias_act;
  static Creator<FusedMHAOp> fused_mha;
  static nvinfer1::IPluginCreatorInterface* const kCreators[] = {&layer_norm_gelu, &group_norm_act, &bias_act, &fused_mha};
  nbCreators = static_cast<int32_t>(sizeof(kCreators) / sizeof(kCreators[0]));
  return kCreators;
}
