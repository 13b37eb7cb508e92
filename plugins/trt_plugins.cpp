// libdeployfuse_trt: the TensorRT IPluginV3 plugins. One adapter per op (the generic
// trt::Adapter<<Op>Attrs> of common/trt_plugin.h, or the op's own plugins/<op>/<op>_trt.h)
// turns TensorRT tensor descriptions and plugin fields into calls of the CUDA launchers (the
// same ones behind the ONNX Runtime library); getCreators registers every adapter of
// trt::Registered, generated from the op registry (deployfuse_trt_ops.h, by gen_op_specs.py;
// ops whose spec says trt_plugin=False are not in it): nothing here changes when an op is added. Names = the ONNX op types,
// namespace "deployfuse" (the ONNX domain), version "1", so TensorRT's ONNX parser maps
// `deployfuse.*` nodes to them. Loaded with IPluginRegistry::loadLibrary, which in TensorRT 10
// and TensorRT-RTX alike needs the two entry points below: `setLoggerFinder` and `getCreators`.
#include <tuple>

#include "common/trt_plugin.h"
#include "deployfuse_trt_ops.h"

namespace {

// One creator per op adapter, in a static array that lives as long as the library.
template <typename... Ops>
nvinfer1::IPluginCreatorInterface* const* creators(deployfuse::OpList<Ops...>, int32_t& count) {
  using namespace deployfuse;
  static_assert(spec::each_op_once<typename Ops::Spec...>(/*tensorrt=*/true),
                "register every TensorRT op of deployfuse/ops/specs.py, once");
  static std::tuple<trt::Creator<Ops>...> owned;
  static nvinfer1::IPluginCreatorInterface* const list[] = {&std::get<trt::Creator<Ops>>(owned)...};
  count = static_cast<int32_t>(sizeof...(Ops));
  return list;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void setLoggerFinder(nvinfer1::ILoggerFinder* finder) {
  deployfuse::trt::g_logger_finder = finder;
}

extern "C" __attribute__((visibility("default"))) nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
  return creators(deployfuse::trt::Registered{}, nbCreators);
}
