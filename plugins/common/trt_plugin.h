// The TensorRT IPluginV3 machinery shared by every deployfuse plugin: attribute fields (as the
// ONNX parser hands them over and as an engine stores them), one plugin template implementing
// IPluginV3OneCore / OneBuild / OneRuntime over an op adapter, and one creator template.
//
// An op adapter is the generic Adapter<<Op>Attrs> at the bottom, or (an op it does not fit, e.g.
// one with a workspace) plugins/<op>/<op>_trt.h, a small struct on the op's attributes (<op>/<op>.h):
//   struct <Op>Op : <Op>Attrs {                            // Spec = spec::<Op>: name, inputs, attributes
//     using <Op>Attrs::<Op>Attrs;                          // from AttrValues; throws std::invalid_argument
//     cudaError_t enqueue(DataType, const PluginTensorDesc* in, int32_t nb_in,
//                         const void* const* inputs, void* output, cudaStream_t) const;
//   };
// Every op has one output with the element type of its first input, fp32/fp16/bf16, linear layout,
// and its shape unless the adapter says otherwise. Two optional adapter members:
//   static bool output_shape(const DimsExprs* in, int32_t nb_in, DimsExprs* out);  // else input 0's
//   static constexpr size_t kWorkspaceBytes;  // then enqueue takes (..., void* output, void* workspace, cudaStream_t)
// Only interfaces are used (no TensorRT symbol is linked), so the library loads into TensorRT 10
// and TensorRT-RTX alike.
#pragma once
#include <NvInferRuntime.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/attrs.h"
#include "common/dtype_dispatch.h"
#include "common/op_inputs.h"
#include "deployfuse_op_specs.h"

namespace deployfuse {
namespace trt {

using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;

constexpr const char* kNamespace = "deployfuse";  // = the ONNX domain
constexpr const char* kVersion = "1";             // = the op set version

inline PluginFieldType field_type(AttrKind kind) {
  switch (kind) {
    case AttrKind::kInt: return PluginFieldType::kINT32;
    case AttrKind::kFloat: return PluginFieldType::kFLOAT32;
    default: return PluginFieldType::kCHAR;
  }
}

// The attribute values of one plugin, read from the fields the parser or an engine hands over
// (checked against the op's generated spec), and written back as the fields an engine stores.
class Fields {
 public:
  template <size_t N>
  static Fields parse(const AttrSpec (&specs)[N], const PluginFieldCollection* fc) {
    return Fields(AttrValues::read(specs, [&](const AttrSpec& spec, double* number, std::string* text) {
      const PluginField* given = find(fc, spec.name);
      if (given == nullptr) return false;
      if (spec.kind == AttrKind::kString) {
        *text = text_of(*given);
      } else {
        *number = number_of(*given);
      }
      return true;
    }));
  }

  const AttrValues& values() const { return values_; }

  // The fields an engine stores; valid until the next call.
  const PluginFieldCollection* serialize() {
    const size_t n = values_.size();
    ints_.assign(n, 0);
    floats_.assign(n, 0.f);
    out_.clear();
    for (size_t i = 0; i < n; ++i) {
      const AttrSpec& s = values_.spec(i);
      if (s.kind == AttrKind::kString) {
        out_.emplace_back(s.name, values_.text(i).c_str(), PluginFieldType::kCHAR, static_cast<int32_t>(values_.text(i).size() + 1));
      } else if (s.kind == AttrKind::kInt) {
        ints_[i] = static_cast<int32_t>(values_.integer(i));
        out_.emplace_back(s.name, &ints_[i], PluginFieldType::kINT32, 1);
      } else {
        floats_[i] = values_.real(i);
        out_.emplace_back(s.name, &floats_[i], PluginFieldType::kFLOAT32, 1);
      }
    }
    collection_.nbFields = static_cast<int32_t>(out_.size());
    collection_.fields = out_.data();
    return &collection_;
  }

 private:
  explicit Fields(AttrValues values) : values_(std::move(values)) {}
  static const PluginField* find(const PluginFieldCollection* fc, const char* name) {
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
      if (fc->fields[i].name != nullptr && std::strcmp(fc->fields[i].name, name) == 0) return &fc->fields[i];
    return nullptr;
  }
  static std::string text_of(const PluginField& f) {
    if (f.type != PluginFieldType::kCHAR && f.type != PluginFieldType::kINT8)
      throw std::invalid_argument(std::string("attribute '") + f.name + "' must be a string");
    const char* data = static_cast<const char*>(f.data);
    return std::string(data, strnlen(data, static_cast<size_t>(f.length)));
  }
  static double number_of(const PluginField& f) {  // the parser may convert ONNX ints/floats to any width
    if (f.length < 1 || f.data == nullptr) throw std::invalid_argument(std::string("attribute '") + f.name + "' is empty");
    switch (f.type) {
      case PluginFieldType::kINT8: return *static_cast<const int8_t*>(f.data);
      case PluginFieldType::kINT16: return *static_cast<const int16_t*>(f.data);
      case PluginFieldType::kINT32: return *static_cast<const int32_t*>(f.data);
      case PluginFieldType::kINT64: return static_cast<double>(*static_cast<const int64_t*>(f.data));
      case PluginFieldType::kFLOAT32: return *static_cast<const float*>(f.data);
      case PluginFieldType::kFLOAT64: return *static_cast<const double*>(f.data);
      default: throw std::invalid_argument(std::string("attribute '") + f.name + "' must be a number");
    }
  }

  AttrValues values_;
  std::vector<int32_t> ints_;
  std::vector<float> floats_;
  std::vector<PluginField> out_;
  PluginFieldCollection collection_{};
};

inline DType dtype_of(DataType type) {
  switch (type) {
    case DataType::kFLOAT: return DType::kFloat;
    case DataType::kHALF: return DType::kHalf;
    case DataType::kBF16: return DType::kBFloat16;
    default: return DType::kUnsupported;
  }
}

// The inputs of an enqueue as linear tensors; throws std::invalid_argument past kMaxInputs inputs.
inline Inputs inputs_of(const PluginTensorDesc* desc, int32_t nb_in, const void* const* inputs) {
  Inputs in;
  for (int32_t i = 0; i < nb_in; ++i) in.add(inputs[i], desc[i].dims.d, desc[i].dims.nbDims);
  return in;
}

// Whether an adapter has the optional members above.
template <typename Op, typename = void>
struct HasOutputShape : std::false_type {};
template <typename Op>
struct HasOutputShape<Op, std::void_t<decltype(&Op::output_shape)>> : std::true_type {};
template <typename Op, typename = void>
struct HasWorkspace : std::false_type {};
template <typename Op>
struct HasWorkspace<Op, std::void_t<decltype(Op::kWorkspaceBytes)>> : std::true_type {};

// The logger TensorRT hands over through setLoggerFinder (null before that).
inline nvinfer1::ILoggerFinder* g_logger_finder = nullptr;

// Plugins cannot throw across the interface: failures go to TensorRT's logger (stderr before
// TensorRT provides one) and out as return codes.
inline void report(const char* op, const char* why) {
  nvinfer1::ILogger* logger = g_logger_finder ? g_logger_finder->findLogger() : nullptr;
  const std::string line = std::string("deployfuse ") + op + ": " + why;
  if (logger != nullptr) {
    logger->log(nvinfer1::ILogger::Severity::kERROR, line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

template <typename Op>
class Plugin final : public nvinfer1::IPluginV3,
                     public nvinfer1::IPluginV3OneCore,
                     public nvinfer1::IPluginV3OneBuild,
                     public nvinfer1::IPluginV3OneRuntime {
 public:
  explicit Plugin(Fields fields) : fields_(std::move(fields)), op_(fields_.values()) {}

  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override {
    switch (type) {
      case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
      case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
      case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    return nullptr;
  }
  nvinfer1::IPluginV3* clone() noexcept override {
    try {
      return new Plugin(*this);
    } catch (const std::exception& e) {
      report(Op::Spec::kName, e.what());
      return nullptr;
    }
  }

  // IPluginV3OneCore
  const char* getPluginName() const noexcept override { return Op::Spec::kName; }
  const char* getPluginVersion() const noexcept override { return kVersion; }
  const char* getPluginNamespace() const noexcept override { return kNamespace; }

  // IPluginV3OneBuild
  int32_t getNbOutputs() const noexcept override { return 1; }
  int32_t getOutputDataTypes(DataType* out, int32_t nb_out, const DataType* in, int32_t nb_in) const noexcept override {
    if (nb_out != 1 || nb_in < 1) return -1;
    out[0] = in[0];
    return 0;
  }
  int32_t getOutputShapes(const nvinfer1::DimsExprs* in, int32_t nb_in, const nvinfer1::DimsExprs*, int32_t, nvinfer1::DimsExprs* out,
                          int32_t nb_out, nvinfer1::IExprBuilder&) noexcept override {
    if (nb_in < Op::Spec::kRequiredInputs || nb_in > Op::Spec::kInputs || nb_out != 1) {
      report(Op::Spec::kName, "wrong number of inputs or outputs");
      return -1;
    }
    if constexpr (HasOutputShape<Op>::value) {
      if (!Op::output_shape(in, nb_in, out)) {
        report(Op::Spec::kName, "input shapes do not fit the op");
        return -1;
      }
    } else {
      out[0] = in[0];
    }
    return 0;
  }
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc*, int32_t, const nvinfer1::DynamicPluginTensorDesc*,
                          int32_t) const noexcept override {
    if constexpr (HasWorkspace<Op>::value) return Op::kWorkspaceBytes;
    return 0;
  }
  bool supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* io, int32_t, int32_t) noexcept override {
    const PluginTensorDesc& d = io[pos].desc;
    if (d.format != nvinfer1::TensorFormat::kLINEAR) return false;
    if (pos == 0) return d.type == DataType::kFLOAT || d.type == DataType::kHALF || d.type == DataType::kBF16;
    return d.type == io[0].desc.type;
  }
  int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc*, int32_t nb_in, const nvinfer1::DynamicPluginTensorDesc*,
                          int32_t) noexcept override {
    nb_inputs_ = nb_in;
    return 0;
  }

  // IPluginV3OneRuntime
  int32_t onShapeChange(const PluginTensorDesc*, int32_t nb_in, const PluginTensorDesc*, int32_t) noexcept override {
    nb_inputs_ = nb_in;
    return 0;
  }
  int32_t enqueue(const PluginTensorDesc* in, const PluginTensorDesc*, const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override {
    cudaError_t err;
    if constexpr (HasWorkspace<Op>::value) {
      err = op_.enqueue(in[0].type, in, nb_inputs_, inputs, outputs[0], workspace, stream);
    } else {
      err = op_.enqueue(in[0].type, in, nb_inputs_, inputs, outputs[0], stream);
    }
    if (err != cudaSuccess) report(Op::Spec::kName, cudaGetErrorString(err));
    return err == cudaSuccess ? 0 : -1;
  }
  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext*) noexcept override { return clone(); }
  const PluginFieldCollection* getFieldsToSerialize() noexcept override { return fields_.serialize(); }

 private:
  Fields fields_;
  Op op_;
  int32_t nb_inputs_ = Op::Spec::kRequiredInputs;
};

template <typename Op>
class Creator final : public nvinfer1::IPluginCreatorV3One {
 public:
  Creator() {
    for (const AttrSpec& a : Op::Spec::kAttrs) names_.emplace_back(a.name, nullptr, field_type(a.kind), 1);
    collection_.nbFields = static_cast<int32_t>(names_.size());
    collection_.fields = names_.data();
  }
  nvinfer1::IPluginV3* createPlugin(const char*, const PluginFieldCollection* fc, nvinfer1::TensorRTPhase) noexcept override {
    try {
      return new Plugin<Op>(Fields::parse(Op::Spec::kAttrs, fc));
    } catch (const std::exception& e) {
      report(Op::Spec::kName, e.what());
      return nullptr;
    }
  }
  const PluginFieldCollection* getFieldNames() noexcept override { return &collection_; }
  const char* getPluginName() const noexcept override { return Op::Spec::kName; }
  const char* getPluginVersion() const noexcept override { return kVersion; }
  const char* getPluginNamespace() const noexcept override { return kNamespace; }

 private:
  std::vector<PluginField> names_;
  PluginFieldCollection collection_{};
};

// The adapter of every op without its own <op>/<op>_trt.h: the op's sizes from <Op>Attrs::sizes
// (<op>/<op>.h), the launch through its run_cuda (<op>/<op>.cuh); what does not fit goes to the
// logger and out as cudaErrorInvalidValue.
template <typename Attrs>
struct Adapter : Attrs {
  using Attrs::Attrs;
  cudaError_t enqueue(DataType type, const PluginTensorDesc* desc, int32_t nb_in, const void* const* inputs, void* y,
                      cudaStream_t stream) const {
    try {
      const Inputs in = inputs_of(desc, nb_in, inputs);
      const typename Attrs::Sizes sizes = this->sizes(in);
      return with_dtype(dtype_of(type), [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return run_cuda(*this, sizes, in, static_cast<T*>(y), stream);
      });
    } catch (const std::exception& e) {
      report(Attrs::Spec::kName, e.what());
      return cudaErrorInvalidValue;
    }
  }
};

}  // namespace trt
}  // namespace deployfuse
