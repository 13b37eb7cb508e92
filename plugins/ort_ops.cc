// libdeployfuse_ort: the ONNX Runtime custom-op library. One adapter per op (the generic
// ort::Adapter<<Op>Attrs> of common/ort_adapter.h, or the op's own plugins/<op>/<op>_ort.h)
// turns ORT tensors and attributes into calls of the CPU kernels / CUDA launchers;
// ort::Registered, generated from the op registry (deployfuse_ort_ops.h, by gen_op_specs.py),
// lists them, and make_registrations registers every one for the CPU EP in fp32, and with
// DEPLOYFUSE_WITH_CUDA for the CUDA EP in fp32/fp16/bf16 (those its adapter's optional
// `static bool takes_on_cuda(ElemType)` accepts). That type is the op's T; an input whose type
// the spec fixes (spec::<Op>::kInputTypes) is registered with it. Nothing here changes when an op
// is added. Built against ORT API 21 headers; loads in ORT >= 1.21.
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/ort_adapter.h"
#include "deployfuse_ort_ops.h"

namespace deployfuse {
namespace ort {
namespace {

constexpr const char* kDomain = "deployfuse";
constexpr const char* kCpu = "CPUExecutionProvider";
constexpr const char* kCuda = "CUDAExecutionProvider";

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
  using Spec = typename Adapter::Spec;
  const char* ep;
  ElemType type;
  Op(const char* provider, ElemType elem) : ep(provider), type(elem) {}
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new Kernel<Adapter>{Adapter(read_attrs<Spec>(Ort::ConstKernelInfo(info))), type, std::strcmp(ep, kCuda) == 0};
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string(Spec::kName) + ": " + e.what()).c_str());
    }
  }
  const char* GetName() const { return Spec::kName; }
  const char* GetExecutionProviderType() const { return ep; }
  size_t GetInputTypeCount() const { return Spec::kInputs; }
  ElemType GetInputType(size_t i) const {
    switch (Spec::kInputTypes[i]) {
      case InputType::kFloat: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
      case InputType::kFloat8E4M3FN: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN;
      default: return type;
    }
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i < static_cast<size_t>(Spec::kRequiredInputs) ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ElemType GetOutputType(size_t) const { return type; }
};

// An adapter with `static bool takes_on_cuda(ElemType)` runs on the CUDA EP only in the types it accepts.
template <typename Adapter, typename = void>
struct Restricted : std::false_type {};
template <typename Adapter>
struct Restricted<Adapter, std::void_t<decltype(Adapter::takes_on_cuda(ElemType{}))>> : std::true_type {};
template <typename Adapter>
void add_op(std::vector<std::unique_ptr<OrtCustomOp>>& ops, const char* ep, ElemType type) {
  if constexpr (Restricted<Adapter>::value)
    if (std::strcmp(ep, kCuda) == 0 && !Adapter::takes_on_cuda(type)) return;
  ops.emplace_back(new Op<Adapter>(ep, type));
}

template <typename... Adapters>
void add_ops(OpList<Adapters...>, std::vector<std::unique_ptr<OrtCustomOp>>& ops, const char* ep, ElemType type) {
  static_assert(spec::each_op_once<typename Adapters::Spec...>(), "register every op of deployfuse/ops/specs.py, once");
  (add_op<Adapters>(ops, ep, type), ...);
}

// Every registered op, for one (provider, element type).
void add_all(std::vector<std::unique_ptr<OrtCustomOp>>& ops, const char* ep, ElemType type) { add_ops(Registered{}, ops, ep, type); }

std::vector<std::unique_ptr<OrtCustomOp>> make_registrations() {
  std::vector<std::unique_ptr<OrtCustomOp>> ops;
  add_all(ops, kCpu, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
#ifdef DEPLOYFUSE_WITH_CUDA
  for (ElemType t : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16})
    add_all(ops, kCuda, t);
#endif
  return ops;
}

}  // namespace
}  // namespace ort
}  // namespace deployfuse

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                            const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(21));
  static auto ops = deployfuse::ort::make_registrations();
  try {
    Ort::CustomOpDomain domain(deployfuse::ort::kDomain);
    for (auto& op : ops) domain.Add(op.get());
    Ort::UnownedSessionOptions(options).Add(domain);
    domain.release();  // the session options keep the domain for the library's lifetime
    return nullptr;
  } catch (const std::exception& e) {
    return Ort::GetApi().CreateStatus(ORT_RUNTIME_EXCEPTION, e.what());
  }
}
