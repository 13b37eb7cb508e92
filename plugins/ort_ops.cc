// libdeployfuse_ort: the ONNX Runtime custom-op library. One adapter per op (the generic
// ort::Adapter<<Op>Attrs> of common/ort_adapter.h, or the op's own plugins/<op>/<op>_ort.h)
// turns ORT tensors and attributes into calls of the CPU kernels / CUDA launchers;
// ort::Registered, generated from the op registry (deployfuse_ort_ops.h, by gen_op_specs.py),
// lists them, and make_registrations registers every one for the CPU EP in fp32 and for the CUDA EP
// in fp16/bf16, and fp32 with DEPLOYFUSE_WITH_CUDA (those its adapter's optional
// `static bool takes_on_cuda(ElemType)` accepts). That type is the op's T; an input whose type
// the spec fixes (spec::<Op>::kInputTypes) is registered with it. ORT gives an op name one schema
// admitting the union of its registrations' types, so a build without CUDA registers the CUDA EP's
// fp16/bf16 too, kernels it refuses to create (naming the missing CUDA build): the schema is then the
// CUDA build's, and the CPU EP runs an fp16 node on the fp32 kernel between Casts (its
// InsertCastTransformer) with either build (a bf16 node, which that transformer leaves alone, on
// neither). Nothing here changes when an op is added. Built against ORT API 21 headers; loads in
// ORT >= 1.21.
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
#ifdef DEPLOYFUSE_WITH_CUDA
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;  // no adapter's Run may then see on_cuda: it has no code for it
#endif

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

// An adapter with `static constexpr size_t kOutputs` and `static ElemType output_type(size_t, ElemType)` has that many outputs, each
// optional, of those types (SkipLayerNormFp8); the others one output Y in T.
template <typename Adapter, typename = void>
struct Outputs {
  static constexpr size_t count = 1;
  static ElemType type(size_t, ElemType t) { return t; }
  static constexpr bool optional = false;
};
template <typename Adapter>
struct Outputs<Adapter, std::void_t<decltype(Adapter::kOutputs)>> {
  static constexpr size_t count = Adapter::kOutputs;
  static ElemType type(size_t i, ElemType t) { return Adapter::output_type(i, t); }
  static constexpr bool optional = true;
};

template <typename Adapter>
struct Op : Ort::CustomOpBase<Op<Adapter>, Kernel<Adapter>, true> {
  using Spec = typename Adapter::Spec;
  const char* ep;
  ElemType type;
  bool fp8_x;  // X registered as float8e4m3fn instead of T (an adapter with kTakesFp8X: Fp8GemmAct, Fp8Mlp)
  Op(const char* provider, ElemType elem, bool float8_x = false) : ep(provider), type(elem), fp8_x(float8_x) {}
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      const bool on_cuda = std::strcmp(ep, kCuda) == 0;
      if (on_cuda && !kWithCuda)
        throw std::runtime_error(
            "this libdeployfuse_ort.so was built without CUDA (no nvcc, or --cuda off), so it has no CUDA EP kernels; "
            "build the CUDA one (`deployfuse plugins build --cuda on`) or run this node on the CPU EP");
      *kernel = new Kernel<Adapter>{make_adapter<Adapter>(Ort::ConstKernelInfo(info)), type, on_cuda};
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string(Spec::kName) + ": " + e.what()).c_str());
    }
  }
  const char* GetName() const { return Spec::kName; }
  const char* GetExecutionProviderType() const { return ep; }
  size_t GetInputTypeCount() const { return Spec::kInputs; }
  ElemType GetInputType(size_t i) const {
    if (i == 0 && fp8_x) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN;
    switch (Spec::kInputTypes[i]) {
      case InputType::kFloat: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
      case InputType::kFloat8E4M3FN: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN;
      case InputType::kInt64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
      default: return type;
    }
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i < static_cast<size_t>(Spec::kRequiredInputs) ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return Outputs<Adapter>::count; }
  ElemType GetOutputType(size_t i) const { return Outputs<Adapter>::type(i, type); }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const {
    return Outputs<Adapter>::optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
};

// An adapter with `static bool takes_on_cuda(ElemType)` runs on the CUDA EP only in the types it accepts.
template <typename Adapter, typename = void>
struct Restricted : std::false_type {};
template <typename Adapter>
struct Restricted<Adapter, std::void_t<decltype(Adapter::takes_on_cuda(ElemType{}))>> : std::true_type {};
// An adapter with `static constexpr bool kTakesFp8X = true` is registered a second time with X in float8e4m3fn (already quantized).
template <typename Adapter, typename = void>
struct TakesFp8X : std::false_type {};
template <typename Adapter>
struct TakesFp8X<Adapter, std::void_t<decltype(Adapter::kTakesFp8X)>> : std::bool_constant<Adapter::kTakesFp8X> {};
template <typename Adapter>
void add_op(std::vector<std::unique_ptr<OrtCustomOp>>& ops, const char* ep, ElemType type) {
  if constexpr (Restricted<Adapter>::value)
    if (std::strcmp(ep, kCuda) == 0 && !Adapter::takes_on_cuda(type)) return;
  ops.emplace_back(new Op<Adapter>(ep, type));
  if constexpr (TakesFp8X<Adapter>::value) ops.emplace_back(new Op<Adapter>(ep, type, true));
}

template <typename... Adapters>
void add_ops(OpList<Adapters...>, std::vector<std::unique_ptr<OrtCustomOp>>& ops, const char* ep, ElemType type) {
  static_assert(spec::each_op_once<typename Adapters::Spec...>(), "register every op of deployfuse/ops/specs.py, once");
  (add_op<Adapters>(ops, ep, type), ...);
}

// Every registered op, for one (provider, element type).
void add_all(std::vector<std::unique_ptr<OrtCustomOp>>& ops, const char* ep, ElemType type) { add_ops(Registered{}, ops, ep, type); }

// Without CUDA the CUDA EP's fp32 is left out: an fp32 node on a CUDA EP session then falls back to the CPU EP's kernel.
std::vector<std::unique_ptr<OrtCustomOp>> make_registrations() {
  std::vector<std::unique_ptr<OrtCustomOp>> ops;
  add_all(ops, kCpu, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  for (ElemType t : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16})
    if (kWithCuda || t != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) add_all(ops, kCuda, t);
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
