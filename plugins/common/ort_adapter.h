// What every ONNX Runtime op adapter (plugins/<op>/<op>_ort.h) uses: the call it runs with, the
// op's attributes read from the kernel info through its generated spec, its inputs (inputs_of), errors,
// and (with DEPLOYFUSE_WITH_CUDA) the launch of a CUDA launcher in the tensor's element type.
//
// Most ops use the generic Adapter<<Op>Attrs> at the bottom (Y shaped like the first input, or as
// <Op>Attrs::y_dims says); an op that needs more (a runner, scratch, several outputs) writes its
// own, a small struct on the op's attributes (plugins/<op>/<op>.h):
//   struct <Op> : <Op>Attrs {                       // Spec = spec::<Op>: name, inputs, attributes
//     using <Op>Attrs::<Op>Attrs;                   // from AttrValues (make_adapter: or with the kernel info); throws on a bad value
//     void Run(Call&, bool on_cuda) const;          // throws std::runtime_error on a bad input
//     static bool takes_on_cuda(ElemType);          // optional: the CUDA EP types it runs in
//   };
// in plugins/<op>/<op>_ort.h. ort_ops.cc registers every op for the CPU EP (fp32) and the CUDA EP
// (fp32/fp16/bf16, or those takes_on_cuda accepts; fp16/bf16 only without DEPLOYFUSE_WITH_CUDA, for the
// schema). Run sees on_cuda only in a build with DEPLOYFUSE_WITH_CUDA: without it ort_ops.cc refuses to
// create a CUDA EP kernel, so a Run's CUDA branch compiled out is never reached.
#pragma once
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define ORT_API_MANUAL_INIT  // the library initialises the API from the one RegisterCustomOps hands over
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT

#include "common/attrs.h"
#include "common/op_inputs.h"
#include "deployfuse_op_specs.h"

#ifdef DEPLOYFUSE_WITH_CUDA
#include <cuda_runtime.h>

#include "common/dtype_dispatch.h"
#endif

namespace deployfuse {
namespace ort {

using ElemType = ONNXTensorElementDataType;

// What every adapter gets: the context, its element type and the CUDA stream (null on the CPU EP).
struct Call {
  Ort::KernelContext ctx;
  ElemType type;
  void* stream;
};

[[noreturn]] inline void fail(const std::string& op, const std::string& why) { throw std::runtime_error(op + ": " + why); }

// The node's attributes, checked against the op's spec (std::invalid_argument naming a bad one);
// an attribute of the wrong type counts as absent.
template <typename Spec>
AttrValues read_attrs(const Ort::ConstKernelInfo& info) {
  return AttrValues::read(Spec::kAttrs, [&](const AttrSpec& spec, double* number, std::string* text) {
    try {
      switch (spec.kind) {
        case AttrKind::kInt: *number = static_cast<double>(info.GetAttribute<int64_t>(spec.name)); break;
        case AttrKind::kFloat: *number = info.GetAttribute<float>(spec.name); break;
        case AttrKind::kString: *text = info.GetAttribute<std::string>(spec.name); break;
      }
      return true;
    } catch (const Ort::Exception&) {
      return false;
    }
  });
}

// A kernel instance's adapter, made from the node's attributes, and from its kernel info too where the adapter has a constructor
// (const AttrValues&, const Ort::ConstKernelInfo&) to read more of the node (Fp8Mlp: whether HScale is a constant initializer).
template <typename Adapter>
Adapter make_adapter(const Ort::ConstKernelInfo& info) {
  const AttrValues attrs = read_attrs<typename Adapter::Spec>(info);
  if constexpr (std::is_constructible_v<Adapter, const AttrValues&, const Ort::ConstKernelInfo&>)
    return Adapter(attrs, info);
  else
    return Adapter(attrs);
}

// The inputs of the call in the spec's order up to the last present one (an absent optional input
// before it stays in place without data; the absent ones after it are left out); throws std::invalid_argument past kMaxInputs inputs or
// kMaxRank dims.
inline Inputs inputs_of(const Ort::KernelContext& ctx) {
  Inputs in;
  size_t count = ctx.GetInputCount();
  while (count > 0 && !ctx.GetInput(count - 1)) --count;  // an absent input before a present one: kept, without data
  for (size_t i = 0; i < count; ++i) {
    auto value = ctx.GetInput(i);
    if (!value) {
      in.add<int64_t>(nullptr, nullptr, 0);
      continue;
    }
    const auto dims = value.GetTensorTypeAndShapeInfo().GetShape();
    in.add(value.GetTensorRawData(), dims.data(), static_cast<int>(dims.size()));
  }
  return in;
}

// The call's present inputs and the sizes the op reads from them (Attrs::sizes); a bad input fails
// naming the op.
template <typename Attrs>
Inputs sized_inputs(const Attrs& op, const Call& c, typename Attrs::Sizes* sizes) {
  Inputs in;
  try {
    in = inputs_of(c.ctx);
    *sizes = op.sizes(in);
  } catch (const std::invalid_argument& e) {
    fail(Attrs::Spec::kName, e.what());
  }
  return in;
}

// The output of a GEMM: X's dims with the last one n.
inline Ort::UnownedValue gemm_output(Call& c, const Tensor& x, int64_t n) {
  std::vector<int64_t> dims(x.dims, x.dims + x.rank);
  dims.back() = n;
  return c.ctx.GetOutput(0, dims);
}

#ifdef DEPLOYFUSE_WITH_CUDA
inline DType dtype_of(ElemType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return DType::kFloat;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return DType::kHalf;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return DType::kBFloat16;
    default: return DType::kUnsupported;
  }
}

// Runs launch(T* tag) -> cudaError_t in the call's element type; throws naming op on failure.
template <typename Fn>
void launch_cuda(const char* op, const Call& c, Fn&& launch) {
  const DType type = dtype_of(c.type);
  if (type == DType::kUnsupported) fail(op, "unsupported element type");
  const cudaError_t err = with_dtype(type, launch);
  if (err != cudaSuccess) fail(op, std::string("CUDA error: ") + cudaGetErrorString(err));
}
#endif

// Whether <Op>Attrs gives Y's dims from its sizes (`std::vector<int64_t> y_dims(const Sizes&) const`: FusedMHA's, whose
// packed Q is three times Y's width); without it Y has X's shape.
template <typename Attrs, typename = void>
struct HasYDims : std::false_type {};
template <typename Attrs>
struct HasYDims<Attrs, std::void_t<decltype(std::declval<const Attrs&>().y_dims(std::declval<const typename Attrs::Sizes&>()))>>
    : std::true_type {};

// The adapter of every op without its own <op>/<op>_ort.h: Y has X's shape (or <Op>Attrs::y_dims);
// the op's sizes come from <Op>Attrs::sizes (std::invalid_argument names a bad input) and it runs
// through the op's run_cpu (<op>/<op>.h) or run_cuda (<op>/<op>.cuh).
template <typename Attrs>
struct Adapter : Attrs {
  using Attrs::Attrs;
  void Run(Call& c, bool on_cuda) const {
    typename Attrs::Sizes sizes;
    const Inputs in = sized_inputs(*this, c, &sizes);
    std::vector<int64_t> dims(in[0].dims, in[0].dims + in[0].rank);
    if constexpr (HasYDims<Attrs>::value) dims = this->y_dims(sizes);
    auto y = c.ctx.GetOutput(0, dims);
    if (!on_cuda) {
      run_cpu(*this, sizes, in, y.GetTensorMutableData<float>());
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    launch_cuda(Attrs::Spec::kName, c, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      try {
        return run_cuda(*this, sizes, in, static_cast<T*>(y.GetTensorMutableRawData()), static_cast<cudaStream_t>(c.stream));
      } catch (const std::invalid_argument& e) {
        fail(Attrs::Spec::kName, e.what());
      }
    });
#endif
  }
};

}  // namespace ort
}  // namespace deployfuse
