// libdeployfuse_ort: the ONNX Runtime custom-op library. Thin adapters turn ORT tensors and
// attributes into calls of the CPU kernels / CUDA launchers; kRegistrations at the bottom is the
// one list of what is registered (every op for the CPU EP in fp32, and with DEPLOYFUSE_WITH_CUDA
// for the CUDA EP in fp32/fp16/bf16). Built against ORT API 21 headers; loads in ORT >= 1.21.
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT

#include "common/activation.h"
#include "common/cpu_kernels.h"
#include "common/mha_shape.h"

#ifdef DEPLOYFUSE_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "bias_act/bias_act.cuh"
#include "fused_mha/fused_mha.cuh"
#include "group_norm_act/group_norm_act.cuh"
#include "layer_norm_gelu/layer_norm_gelu.cuh"
#endif

namespace deployfuse {
namespace {

constexpr const char* kDomain = "deployfuse";
constexpr const char* kCpu = "CPUExecutionProvider";
constexpr const char* kCuda = "CUDAExecutionProvider";

using ElemType = ONNXTensorElementDataType;

template <typename T>
T attr_or(const Ort::ConstKernelInfo& info, const char* name, T fallback) {
  try {
    return info.GetAttribute<T>(name);
  } catch (const Ort::Exception&) {
    return fallback;
  }
}

int64_t product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= dims[i];
  return n;
}

void fail(const std::string& op, const std::string& why) { throw std::runtime_error(op + ": " + why); }

#ifdef DEPLOYFUSE_WITH_CUDA
void check_cuda(const char* op, cudaError_t err) {
  if (err != cudaSuccess) fail(op, std::string("CUDA error: ") + cudaGetErrorString(err));
}

// Calls fn with a typed null pointer selecting float / __half / __nv_bfloat16.
template <typename Fn>
void dispatch_cuda(ElemType type, Fn&& fn) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: fn(static_cast<float*>(nullptr)); break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: fn(static_cast<__half*>(nullptr)); break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: fn(static_cast<__nv_bfloat16*>(nullptr)); break;
    default: throw std::runtime_error("unsupported element type");
  }
}
#endif

// What every adapter gets: the context, its element type and the CUDA stream (null on the CPU EP).
struct Call {
  Ort::KernelContext ctx;
  ElemType type;
  void* stream;
};

// ----------------------------------------------------------------------------- LayerNormGelu
struct LayerNormGelu {
  static constexpr const char* kName = "LayerNormGelu";
  static constexpr size_t kInputs = 3, kRequired = 3;
  int64_t axis;
  float epsilon;
  bool tanh_approx;
  explicit LayerNormGelu(const Ort::ConstKernelInfo& info)
      : axis(attr_or<int64_t>(info, "axis", -1)), epsilon(attr_or<float>(info, "epsilon", 1e-5f)) {
    const std::string approx = attr_or<std::string>(info, "approximate", "none");
    if (approx != "none" && approx != "tanh") fail(kName, "approximate must be 'none' or 'tanh', got '" + approx + "'");
    tanh_approx = approx == "tanh";
  }
  void Run(Call& c, bool on_cuda) const {
    auto x = c.ctx.GetInput(0);
    auto dims = x.GetTensorTypeAndShapeInfo().GetShape();
    const int64_t rank = static_cast<int64_t>(dims.size()), a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank) fail(kName, "axis out of range");
    const int64_t rows = product(dims, 0, a), cols = product(dims, a, dims.size());
    if (c.ctx.GetInput(1).GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(cols) ||
        c.ctx.GetInput(2).GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(cols))
      fail(kName, "Scale and Bias must have the size of the normalised dims");
    auto y = c.ctx.GetOutput(0, dims);
    if (!on_cuda) {
      layer_norm_gelu_cpu(x.GetTensorData<float>(), c.ctx.GetInput(1).GetTensorData<float>(), c.ctx.GetInput(2).GetTensorData<float>(),
                          y.GetTensorMutableData<float>(), rows, cols, epsilon, tanh_approx);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    dispatch_cuda(c.type, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      check_cuda(kName, launch_layer_norm_gelu<T>(static_cast<cudaStream_t>(c.stream), static_cast<const T*>(x.GetTensorRawData()),
                                                  static_cast<const T*>(c.ctx.GetInput(1).GetTensorRawData()),
                                                  static_cast<const T*>(c.ctx.GetInput(2).GetTensorRawData()),
                                                  static_cast<T*>(y.GetTensorMutableRawData()), rows, cols, epsilon, tanh_approx));
    });
#endif
  }
};

// ----------------------------------------------------------------------------- GroupNormAct
struct GroupNormAct {
  static constexpr const char* kName = "GroupNormAct";
  static constexpr size_t kInputs = 3, kRequired = 3;
  int64_t groups;
  float epsilon;
  Act act;
  explicit GroupNormAct(const Ort::ConstKernelInfo& info)
      : groups(attr_or<int64_t>(info, "num_groups", 0)), epsilon(attr_or<float>(info, "epsilon", 1e-5f)) {
    const std::string name = attr_or<std::string>(info, "activation", "silu");
    if (groups <= 0) fail(kName, "num_groups is required and must be positive");
    if (!parse_act(name.c_str(), &act) || (act != Act::kSilu && act != Act::kGelu && act != Act::kNone))
      fail(kName, "activation must be silu, gelu or none, got '" + name + "'");
  }
  void Run(Call& c, bool on_cuda) const {
    auto x = c.ctx.GetInput(0);
    auto dims = x.GetTensorTypeAndShapeInfo().GetShape();
    if (dims.size() < 2) fail(kName, "X must be [N, C, ...]");
    const int64_t n = dims[0], channels = dims[1], spatial = product(dims, 2, dims.size());
    if (channels % groups != 0) fail(kName, "channels not divisible by num_groups");
    auto y = c.ctx.GetOutput(0, dims);
    if (!on_cuda) {
      group_norm_act_cpu(x.GetTensorData<float>(), c.ctx.GetInput(1).GetTensorData<float>(), c.ctx.GetInput(2).GetTensorData<float>(),
                         y.GetTensorMutableData<float>(), n, channels, spatial, groups, epsilon, act);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    dispatch_cuda(c.type, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      check_cuda(kName, launch_group_norm_act<T>(static_cast<cudaStream_t>(c.stream), static_cast<const T*>(x.GetTensorRawData()),
                                                 static_cast<const T*>(c.ctx.GetInput(1).GetTensorRawData()),
                                                 static_cast<const T*>(c.ctx.GetInput(2).GetTensorRawData()),
                                                 static_cast<T*>(y.GetTensorMutableRawData()), n, channels, spatial, groups, epsilon, act));
    });
#endif
  }
};

// ----------------------------------------------------------------------------- BiasAct
struct BiasAct {
  static constexpr const char* kName = "BiasAct";
  static constexpr size_t kInputs = 2, kRequired = 2;
  Act act;
  explicit BiasAct(const Ort::ConstKernelInfo& info) {
    const std::string name = attr_or<std::string>(info, "activation", "gelu");
    if (!parse_act(name.c_str(), &act) || act == Act::kNone) fail(kName, "unknown activation '" + name + "'");
  }
  void Run(Call& c, bool on_cuda) const {
    auto x = c.ctx.GetInput(0);
    auto dims = x.GetTensorTypeAndShapeInfo().GetShape();
    const int64_t total = product(dims, 0, dims.size()), cols = dims.empty() ? 1 : dims.back();
    if (c.ctx.GetInput(1).GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(cols))
      fail(kName, "Bias must have the size of X's last axis");
    auto y = c.ctx.GetOutput(0, dims);
    if (!on_cuda) {
      bias_act_cpu(x.GetTensorData<float>(), c.ctx.GetInput(1).GetTensorData<float>(), y.GetTensorMutableData<float>(), total, cols, act);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    dispatch_cuda(c.type, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      check_cuda(kName, launch_bias_act<T>(static_cast<cudaStream_t>(c.stream), static_cast<const T*>(x.GetTensorRawData()),
                                           static_cast<const T*>(c.ctx.GetInput(1).GetTensorRawData()),
                                           static_cast<T*>(y.GetTensorMutableRawData()), total, cols, act));
    });
#endif
  }
};

// ----------------------------------------------------------------------------- FusedMHA
struct FusedMHA {
  static constexpr const char* kName = "FusedMHA";
  static constexpr size_t kInputs = 4, kRequired = 3;
  int64_t heads;
  float scale;
  bool causal;
  explicit FusedMHA(const Ort::ConstKernelInfo& info)
      : heads(attr_or<int64_t>(info, "num_heads", 0)), scale(attr_or<float>(info, "scale", 0.f)),
        causal(attr_or<int64_t>(info, "causal", 0) != 0) {
    if (heads <= 0) fail(kName, "num_heads is required and must be positive");
  }
  void Run(Call& c, bool on_cuda) const {
    auto q = c.ctx.GetInput(0), k = c.ctx.GetInput(1), v = c.ctx.GetInput(2);
    auto qd = q.GetTensorTypeAndShapeInfo().GetShape(), kd = k.GetTensorTypeAndShapeInfo().GetShape();
    if (qd.size() != 3 || kd.size() != 3 || v.GetTensorTypeAndShapeInfo().GetShape() != kd || kd[2] != qd[2] || kd[0] != qd[0])
      fail(kName, "Q, K, V must be [batch, seq, heads*head_dim] with equal hidden sizes");
    if (qd[2] % heads != 0) fail(kName, "hidden size not divisible by num_heads");
    MhaShape s{qd[0], qd[1], kd[1], heads, qd[2] / heads, scale, causal, {0, 0, 0, 0}};
    if (s.scale == 0.f) s.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
    const void* mask = nullptr;
    if (c.ctx.GetInputCount() > 3) {
      auto m = c.ctx.GetInput(3);
      if (m) {
        auto md = m.GetTensorTypeAndShapeInfo().GetShape();
        if (!set_mask_strides(md.data(), static_cast<int>(md.size()), &s))
          fail(kName, "Mask is not broadcastable to [batch, heads, q_seq, k_seq]");
        mask = m.GetTensorRawData();
      }
    }
    auto y = c.ctx.GetOutput(0, qd);
    if (!on_cuda) {
      fused_mha_cpu(q.GetTensorData<float>(), k.GetTensorData<float>(), v.GetTensorData<float>(), static_cast<const float*>(mask),
                    y.GetTensorMutableData<float>(), s);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    if (s.head_dim > 256) fail(kName, "head_dim > 256 is not supported on CUDA");
    dispatch_cuda(c.type, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      check_cuda(kName, launch_fused_mha<T>(static_cast<cudaStream_t>(c.stream), static_cast<const T*>(q.GetTensorRawData()),
                                            static_cast<const T*>(k.GetTensorRawData()), static_cast<const T*>(v.GetTensorRawData()),
                                            static_cast<const T*>(mask), static_cast<T*>(y.GetTensorMutableRawData()), s));
    });
#endif
  }
};

// ----------------------------------------------------------------------------- ORT glue

template <typename Adapter>
struct Kernel {
  Adapter adapter;
  ElemType type;
  bool on_cuda;
  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    try {
      Call call{Ort::KernelContext(context), type, nullptr};
      if (on_cuda) call.stream = call.ctx.GetGPUComputeStream();
      adapter.Run(call, on_cuda);
      return nullptr;
    } catch (const std::exception& e) {
      return Ort::GetApi().CreateStatus(ORT_RUNTIME_EXCEPTION, e.what());
    }
  }
};

template <typename Adapter>
struct Op : Ort::CustomOpBase<Op<Adapter>, Kernel<Adapter>, true> {
  const char* ep;
  ElemType type;
  Op(const char* provider, ElemType elem) : ep(provider), type(elem) {}
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new Kernel<Adapter>{Adapter(Ort::ConstKernelInfo(info)), type, std::strcmp(ep, kCuda) == 0};
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, e.what());
    }
  }
  const char* GetName() const { return Adapter::kName; }
  const char* GetExecutionProviderType() const { return ep; }
  size_t GetInputTypeCount() const { return Adapter::kInputs; }
  ElemType GetInputType(size_t) const { return type; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i < Adapter::kRequired ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ElemType GetOutputType(size_t) const { return type; }
};

// The one registration list: (op, provider, element type).
std::vector<std::unique_ptr<OrtCustomOp>> make_registrations() {
  std::vector<std::unique_ptr<OrtCustomOp>> ops;
  auto add_all = [&](const char* ep, ElemType type) {
    ops.emplace_back(new Op<LayerNormGelu>(ep, type));
    ops.emplace_back(new Op<GroupNormAct>(ep, type));
    ops.emplace_back(new Op<BiasAct>(ep, type));
    ops.emplace_back(new Op<FusedMHA>(ep, type));
  };
  add_all(kCpu, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
#ifdef DEPLOYFUSE_WITH_CUDA
  for (ElemType t : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16})
    add_all(kCuda, t);
#endif
  return ops;
}

}  // namespace
}  // namespace deployfuse

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                            const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(21));
  static auto ops = deployfuse::make_registrations();
  try {
    Ort::CustomOpDomain domain(deployfuse::kDomain);
    for (auto& op : ops) domain.Add(op.get());
    Ort::UnownedSessionOptions(options).Add(domain);
    domain.release();  // the session options keep the domain for the library's lifetime
    return nullptr;
  } catch (const std::exception& e) {
    return Ort::GetApi().CreateStatus(ORT_RUNTIME_EXCEPTION, e.what());
  }
}
