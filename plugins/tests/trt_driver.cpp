// trt_driver: plays TensorRT's part for libdeployfuse_trt.so, without TensorRT. It loads the
// plugin library as IPluginRegistry::loadLibrary does (dlopen, setLoggerFinder, getCreators) and
// drives every case of a manifest through the IPluginV3 life cycle in the order TensorRT does:
// build phase (createPlugin, clone, capabilities, getOutputDataTypes, getOutputShapes over its own
// IExprBuilder, supportsFormatCombination at every position, configurePlugin, getWorkspaceSize),
// runtime (attachToContext, onShapeChange, enqueue on a stream with NaN-poisoned device outputs),
// then the engine round trip (getFieldsToSerialize -> createPlugin(kRUNTIME) -> enqueue again) and
// destruction. Linked with the CUDA runtime only; no TensorRT library exists in this process.
//
//   trt_driver LIB MANIFEST [--no-enqueue]
//
// MANIFEST (written by plugins/tests/trt_driver_check.py), one case per block:
//   case ID OP DTYPE             DTYPE: float | half | bf16
//   attr NAME i|f|s VALUE        one per given attribute
//   in RANK D0 D1 ... PATH       one per input, raw little-endian elements of DTYPE
//   out PATH                     the first enqueue's output; PATH.again the re-created plugin's
//   end
// Output: one JSON object per line and step, {"case","op","step","ok","detail"}; then one
// {"case","op","summary":true,"ok","failed":[...]} per case. Exit 0 when every step passed.
#include <NvInferRuntime.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace {

// ---------- JSON lines ----------
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

struct Case;
std::string g_case = "-", g_op = "-";
std::vector<std::string> g_failed;
std::string g_logged;  // what the plugin logged since the last step

void step(const std::string& name, bool ok, const std::string& detail = "") {
  std::string d = detail;
  if (!g_logged.empty()) d += (d.empty() ? "" : "; ") + std::string("plugin logged: ") + g_logged;
  g_logged.clear();
  std::cout << "{\"case\":" << quoted(g_case) << ",\"op\":" << quoted(g_op) << ",\"step\":" << quoted(name)
            << ",\"ok\":" << (ok ? "true" : "false") << ",\"detail\":" << quoted(d) << "}" << std::endl;
  if (!ok) g_failed.push_back(name);
}

// ---------- the logger TensorRT hands to plugin libraries ----------
class Logger : public ILogger {
 public:
  void log(Severity severity, const char* msg) noexcept override {
    if (severity <= Severity::kWARNING) g_logged += (g_logged.empty() ? "" : " | ") + std::string(msg);
  }
};
class LoggerFinder : public ILoggerFinder {
 public:
  ILogger* findLogger() noexcept override { return &logger_; }

 private:
  Logger logger_;
};

// ---------- symbolic dimensions: an IExprBuilder of our own ----------
// IDimensionExpr/IExprBuilder forward to an implementation object (apiv::V*), as in TensorRT;
// each expression is a constant, a named symbol (an input's dynamic dimension) or an operation.
class Expr;
class ExprImpl final : public apiv::VDimensionExpr {
 public:
  enum Kind { kConst, kSymbol, kOp } kind = kConst;
  int64_t value = 0;
  std::string symbol;
  DimensionOperation op = DimensionOperation::kSUM;
  const Expr* a = nullptr;
  const Expr* b = nullptr;
  bool isConstant() const override { return kind == kConst; }
  int64_t getConstantValue() const override { return kind == kConst ? value : std::numeric_limits<int64_t>::min(); }
  bool isSizeTensor() const override { return false; }
};
class Expr final : public IDimensionExpr {
 public:
  Expr() { mImpl = &impl; }
  ~Expr() noexcept override = default;
  ExprImpl impl;
  // The value under an assignment of the symbols; false when a symbol is unbound or the operation is undefined.
  bool eval(const std::map<std::string, int64_t>& env, int64_t* out) const {
    switch (impl.kind) {
      case ExprImpl::kConst: *out = impl.value; return true;
      case ExprImpl::kSymbol: {
        auto it = env.find(impl.symbol);
        if (it == env.end()) return false;
        *out = it->second;
        return true;
      }
      case ExprImpl::kOp: {
        int64_t x, y;
        if (!impl.a->eval(env, &x) || !impl.b->eval(env, &y)) return false;
        switch (impl.op) {
          case DimensionOperation::kSUM: *out = x + y; return true;
          case DimensionOperation::kPROD: *out = x * y; return true;
          case DimensionOperation::kMAX: *out = x > y ? x : y; return true;
          case DimensionOperation::kMIN: *out = x < y ? x : y; return true;
          case DimensionOperation::kSUB: *out = x - y; return true;
          case DimensionOperation::kEQUAL: *out = x == y; return true;
          case DimensionOperation::kLESS: *out = x < y; return true;
          case DimensionOperation::kFLOOR_DIV:
            if (y == 0) return false;
            *out = x / y - ((x % y != 0) && ((x < 0) != (y < 0)));
            return true;
          case DimensionOperation::kCEIL_DIV:
            if (y == 0) return false;
            *out = (x + y - 1) / y;
            return true;
        }
        return false;
      }
    }
    return false;
  }
};
class ExprBuilderImpl final : public apiv::VExprBuilder {
 public:
  const IDimensionExpr* constant(int64_t value) override {
    Expr* e = make();
    e->impl.kind = ExprImpl::kConst;
    e->impl.value = value;
    return e;
  }
  const IDimensionExpr* operation(DimensionOperation op, const IDimensionExpr& first, const IDimensionExpr& second) override {
    Expr* e = make();
    e->impl.kind = ExprImpl::kOp;
    e->impl.op = op;
    e->impl.a = static_cast<const Expr*>(&first);
    e->impl.b = static_cast<const Expr*>(&second);
    return e;
  }
  const IDimensionExpr* declareSizeTensor(int32_t, const IDimensionExpr&, const IDimensionExpr&) override { return nullptr; }
  const Expr* symbol(const std::string& name) {
    Expr* e = make();
    e->impl.kind = ExprImpl::kSymbol;
    e->impl.symbol = name;
    return e;
  }
  bool owns(const IDimensionExpr* e) const {
    for (const auto& p : owned_)
      if (p.get() == e) return true;
    return false;
  }

 private:
  Expr* make() {
    owned_.emplace_back(new Expr());
    return owned_.back().get();
  }
  std::vector<std::unique_ptr<Expr>> owned_;
};
class ExprBuilder final : public IExprBuilder {
 public:
  ExprBuilder() { mImpl = &impl; }
  ~ExprBuilder() noexcept override = default;
  ExprBuilderImpl impl;
};

// ---------- the resource context handed to attachToContext ----------
class ResourceContext final : public IPluginResourceContext {
 public:
  IGpuAllocator* getGpuAllocator() const noexcept override { return nullptr; }
  IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
};

// ---------- manifest ----------
struct Attr {
  std::string name;
  char kind;
  std::string text;
  int32_t i = 0;
  float f = 0.f;
};
struct Input {
  Dims dims{};
  std::string path;
};
struct Case {
  std::string id, op, dtype_name;
  DataType dtype = DataType::kFLOAT;
  std::vector<Attr> attrs;
  std::vector<Input> inputs;
  std::string out;
  Dims out_dims{-1, {}};  // nbDims -1: input 0's shape
};

bool parse_dtype(const std::string& s, DataType* t) {
  if (s == "float")
    *t = DataType::kFLOAT;
  else if (s == "half")
    *t = DataType::kHALF;
  else if (s == "bf16")
    *t = DataType::kBF16;
  else
    return false;
  return true;
}
size_t elem_size(DataType t) { return t == DataType::kFLOAT ? 4 : 2; }
int64_t volume(const Dims& d) {
  int64_t n = 1;
  for (int32_t i = 0; i < d.nbDims; ++i) n *= d.d[i];
  return n;
}
std::string dims_text(const Dims& d) {
  std::string s = "[";
  for (int32_t i = 0; i < d.nbDims; ++i) s += (i ? "," : "") + std::to_string(d.d[i]);
  return s + "]";
}

std::vector<Case> read_manifest(const char* path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot read manifest ") + path);
  std::vector<Case> cases;
  std::string line;
  Case c;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string word;
    if (!(ls >> word)) continue;
    if (word == "case") {
      c = Case();
      ls >> c.id >> c.op >> c.dtype_name;
      if (!parse_dtype(c.dtype_name, &c.dtype)) throw std::runtime_error("bad dtype in: " + line);
    } else if (word == "attr") {
      Attr a;
      ls >> a.name >> a.kind;
      if (a.kind == 'i')
        ls >> a.i;
      else if (a.kind == 'f')
        ls >> a.f;
      else
        ls >> a.text;
      c.attrs.push_back(a);
    } else if (word == "in") {
      Input x;
      ls >> x.dims.nbDims;
      for (int32_t i = 0; i < x.dims.nbDims; ++i) ls >> x.dims.d[i];
      ls >> x.path;
      c.inputs.push_back(x);
    } else if (word == "out") {
      ls >> c.out;
    } else if (word == "outdims") {  // the output's shape, when it is not input 0's
      ls >> c.out_dims.nbDims;
      for (int32_t i = 0; i < c.out_dims.nbDims; ++i) ls >> c.out_dims.d[i];
    } else if (word == "end") {
      cases.push_back(c);
    } else {
      throw std::runtime_error("bad manifest line: " + line);
    }
  }
  return cases;
}

// ---------- the plugin library, loaded as IPluginRegistry::loadLibrary does ----------
struct Library {
  std::vector<IPluginCreatorInterface*> creators;
};

using GetCreators = IPluginCreatorInterface* const* (*)(int32_t&);
using SetLoggerFinder = void (*)(ILoggerFinder*);

bool load_library(const char* path, LoggerFinder* finder, Library* lib) {
  void* handle = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
  step("dlopen", handle != nullptr, handle ? path : dlerror());
  if (!handle) return false;
  auto set_finder = reinterpret_cast<SetLoggerFinder>(dlsym(handle, "setLoggerFinder"));
  auto get_creators = reinterpret_cast<GetCreators>(dlsym(handle, "getCreators"));
  step("entry points", set_finder && get_creators, "setLoggerFinder and getCreators exported");
  if (!set_finder || !get_creators) return false;
  set_finder(finder);
  int32_t n = -1;
  IPluginCreatorInterface* const* list = get_creators(n);
  bool ok = list != nullptr && n > 0;
  std::string names;
  std::map<std::string, int> seen;
  for (int32_t i = 0; ok && i < n; ++i) {
    IPluginCreatorInterface* c = list[i];
    InterfaceInfo info = c->getInterfaceInfo();
    // TensorRT takes only creators whose interface it knows; V3One is "PLUGIN CREATOR_V3ONE" 1.0.
    if (std::strcmp(info.kind, "PLUGIN CREATOR_V3ONE") != 0 || info.major != 1 || info.minor != 0) {
      ok = false;
      names += std::string(" unexpected interface ") + info.kind;
      continue;
    }
    auto* v3 = static_cast<IPluginCreatorV3One*>(c);
    const std::string key = std::string(v3->getPluginNamespace()) + "::" + v3->getPluginName() + "/" + v3->getPluginVersion();
    if (seen[key]++) ok = false;  // the registry refuses a second creator under one key
    names += (names.empty() ? "" : " ") + key;
    lib->creators.push_back(c);
  }
  step("getCreators", ok, std::to_string(n) + " creators: " + names);
  return ok;
}

IPluginCreatorV3One* find_creator(const Library& lib, const std::string& name, const char* version, const char* ns) {
  for (IPluginCreatorInterface* c : lib.creators) {
    auto* v3 = static_cast<IPluginCreatorV3One*>(c);
    if (name == v3->getPluginName() && std::strcmp(version, v3->getPluginVersion()) == 0 && std::strcmp(ns, v3->getPluginNamespace()) == 0)
      return v3;
  }
  return nullptr;
}

// The fields the ONNX parser hands to createPlugin: ints as INT32, floats as FLOAT32, strings as CHAR.
struct FieldSet {
  std::vector<PluginField> fields;
  PluginFieldCollection fc{};
  explicit FieldSet(const std::vector<Attr>& attrs) {
    for (const Attr& a : attrs) {
      if (a.kind == 'i')
        fields.emplace_back(a.name.c_str(), &a.i, PluginFieldType::kINT32, 1);
      else if (a.kind == 'f')
        fields.emplace_back(a.name.c_str(), &a.f, PluginFieldType::kFLOAT32, 1);
      else
        fields.emplace_back(a.name.c_str(), a.text.c_str(), PluginFieldType::kCHAR, static_cast<int32_t>(a.text.size()));
    }
    fc.nbFields = static_cast<int32_t>(fields.size());
    fc.fields = fields.data();
  }
};

// A deep copy of getFieldsToSerialize's answer: what an engine file stores.
struct StoredFields {
  std::vector<std::string> names;
  std::vector<std::vector<char>> data;
  std::vector<PluginField> fields;
  PluginFieldCollection fc{};
  explicit StoredFields(const PluginFieldCollection* src) {
    const int32_t n = src ? src->nbFields : 0;
    names.reserve(n);
    data.reserve(n);
    for (int32_t i = 0; i < n; ++i) {
      const PluginField& f = src->fields[i];
      size_t width = 1;
      switch (f.type) {
        case PluginFieldType::kINT32:
        case PluginFieldType::kFLOAT32: width = 4; break;
        case PluginFieldType::kINT64:
        case PluginFieldType::kFLOAT64: width = 8; break;
        case PluginFieldType::kINT16:
        case PluginFieldType::kFLOAT16:
        case PluginFieldType::kBF16: width = 2; break;
        default: width = 1;
      }
      names.emplace_back(f.name);
      data.emplace_back(static_cast<const char*>(f.data), static_cast<const char*>(f.data) + width * static_cast<size_t>(f.length));
    }
    for (int32_t i = 0; i < n; ++i) fields.emplace_back(names[i].c_str(), data[i].data(), src->fields[i].type, src->fields[i].length);
    fc.nbFields = n;
    fc.fields = fields.data();
  }
  std::string describe() const {
    std::string s;
    for (size_t i = 0; i < fields.size(); ++i) s += (i ? "," : "") + names[i];
    return s;
  }
};

template <typename T>
T* capability(IPluginV3* p, PluginCapabilityType type) {
  return p ? static_cast<T*>(p->getCapabilityInterface(type)) : nullptr;
}

// ---------- device buffers ----------
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// One enqueue as an execution context runs it: onShapeChange with the concrete shapes, then
// enqueue on a stream, the output poisoned with NaN (0xFF bytes) first. Writes the output to `path`.
bool run_enqueue(const std::string& label, IPluginV3OneRuntime* rt, const Case& c, const std::vector<PluginTensorDesc>& in_desc,
                 const PluginTensorDesc& out_desc, std::vector<DeviceBuffer>& inputs, size_t workspace_bytes, const std::string& path,
                 std::vector<char>* host_out) {
  const int32_t nb_in = static_cast<int32_t>(in_desc.size());
  const int32_t rc_shape = rt->onShapeChange(in_desc.data(), nb_in, &out_desc, 1);
  step(label + ".onShapeChange", rc_shape == 0, "rc " + std::to_string(rc_shape));
  if (rc_shape != 0) return false;
  DeviceBuffer out, workspace;
  out.bytes = static_cast<size_t>(volume(out_desc.dims)) * elem_size(c.dtype);
  cudaStream_t stream = nullptr;
  cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaMalloc(&out.ptr, out.bytes ? out.bytes : 1);
  if (err == cudaSuccess && workspace_bytes) err = cudaMalloc(&workspace.ptr, workspace_bytes);
  if (err == cudaSuccess) err = cudaMemsetAsync(out.ptr, 0xFF, out.bytes, stream);  // NaN in fp32, fp16 and bf16
  std::vector<const void*> ptrs;
  for (auto& b : inputs) ptrs.push_back(b.ptr);
  void* outs[] = {out.ptr};
  int32_t rc = -1;
  if (err == cudaSuccess) rc = rt->enqueue(in_desc.data(), &out_desc, ptrs.data(), outs, workspace.ptr, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  host_out->assign(out.bytes, 0);
  if (err == cudaSuccess) err = cudaMemcpy(host_out->data(), out.ptr, out.bytes, cudaMemcpyDeviceToHost);
  if (stream) cudaStreamDestroy(stream);
  const bool ok = rc == 0 && err == cudaSuccess;
  step(label + ".enqueue", ok, "rc " + std::to_string(rc) + ", " + cudaGetErrorString(err) + ", output " + dims_text(out_desc.dims));
  if (ok) {
    std::ofstream f(path, std::ios::binary);
    f.write(host_out->data(), static_cast<std::streamsize>(host_out->size()));
  }
  return ok;
}

const DataType kTypes[] = {DataType::kFLOAT, DataType::kHALF, DataType::kBF16, DataType::kINT8, DataType::kINT32, DataType::kBOOL};
const TensorFormat kFormats[] = {TensorFormat::kLINEAR, TensorFormat::kCHW2, TensorFormat::kHWC8, TensorFormat::kCHW32};

void drive(const Library& lib, const Case& c, bool with_enqueue) {
  g_case = c.id;
  g_op = c.op;
  g_failed.clear();
  const int32_t nb_in = static_cast<int32_t>(c.inputs.size());

  // 1. creator lookup by name, version and namespace (the ONNX node's op type, "1", its domain)
  IPluginCreatorV3One* creator = find_creator(lib, c.op, "1", "deployfuse");
  step("creator lookup", creator != nullptr, c.op + " version 1 namespace deployfuse");
  if (!creator) return;
  const PluginFieldCollection* names = creator->getFieldNames();
  bool names_ok = names != nullptr;
  for (const Attr& a : c.attrs) {
    bool found = false;
    for (int32_t i = 0; names_ok && i < names->nbFields; ++i) found |= a.name == names->fields[i].name;
    names_ok &= found;
  }
  step("getFieldNames", names_ok, std::to_string(names ? names->nbFields : -1) + " fields, every given attribute among them");

  // 2. createPlugin (build phase) from the parser's fields, then the clone the network keeps
  FieldSet given(c.attrs);
  std::unique_ptr<IPluginV3> created(creator->createPlugin(c.op.c_str(), &given.fc, TensorRTPhase::kBUILD));
  step("createPlugin", created != nullptr, std::to_string(given.fc.nbFields) + " fields");
  if (!created) return;
  std::unique_ptr<IPluginV3> plugin(created->clone());
  created.reset();  // the clone must not depend on the original
  step("clone", plugin != nullptr);
  if (!plugin) return;

  // 3. capability interfaces: each present, of the kind and version TensorRT expects
  struct Cap {
    PluginCapabilityType type;
    const char* kind;
  } caps[] = {{PluginCapabilityType::kCORE, "PLUGIN_V3ONE_CORE"},
              {PluginCapabilityType::kBUILD, "PLUGIN_V3ONE_BUILD"},
              {PluginCapabilityType::kRUNTIME, "PLUGIN_V3ONE_RUNTIME"}};
  for (const Cap& cap : caps) {
    IPluginCapability* p = plugin->getCapabilityInterface(cap.type);
    InterfaceInfo info = p ? p->getInterfaceInfo() : InterfaceInfo{"none", 0, 0};
    step(std::string("getCapabilityInterface.") + cap.kind,
         p && std::strcmp(info.kind, cap.kind) == 0 && info.major == 1 && info.minor == 0,
         std::string(info.kind) + " " + std::to_string(info.major) + "." + std::to_string(info.minor));
  }
  auto* core = capability<IPluginV3OneCore>(plugin.get(), PluginCapabilityType::kCORE);
  auto* build = capability<IPluginV3OneBuild>(plugin.get(), PluginCapabilityType::kBUILD);
  if (!core || !build) return;
  step("core identity",
       c.op == core->getPluginName() && std::string("1") == core->getPluginVersion() &&
           std::string("deployfuse") == core->getPluginNamespace(),
       std::string(core->getPluginNamespace()) + "::" + core->getPluginName() + "/" + core->getPluginVersion());

  // 4. output count and types
  const int32_t nb_out = build->getNbOutputs();
  step("getNbOutputs", nb_out == 1, std::to_string(nb_out));
  if (nb_out != 1) return;
  std::vector<DataType> in_types(nb_in, c.dtype);
  DataType out_type = DataType::kINT64;
  const int32_t rc_types = build->getOutputDataTypes(&out_type, 1, in_types.data(), nb_in);
  step("getOutputDataTypes", rc_types == 0 && out_type == c.dtype, "rc " + std::to_string(rc_types));

  // 5. getOutputShapes: every input dimension a symbol (as for a dynamic profile), then all constants
  ExprBuilder builder;
  std::map<std::string, int64_t> env;
  std::vector<DimsExprs> sym(nb_in), con(nb_in);
  for (int32_t i = 0; i < nb_in; ++i) {
    sym[i].nbDims = con[i].nbDims = c.inputs[i].dims.nbDims;
    for (int32_t d = 0; d < c.inputs[i].dims.nbDims; ++d) {
      const std::string s = "in" + std::to_string(i) + ".d" + std::to_string(d);
      sym[i].d[d] = builder.impl.symbol(s);
      env[s] = c.inputs[i].dims.d[d];
      con[i].d[d] = builder.constant(c.inputs[i].dims.d[d]);
    }
  }
  const Dims& expect = c.out_dims.nbDims >= 0 ? c.out_dims : c.inputs[0].dims;
  for (int pass = 0; pass < 2; ++pass) {
    DimsExprs out{};
    const int32_t rc = build->getOutputShapes(pass == 0 ? sym.data() : con.data(), nb_in, nullptr, 0, &out, 1, builder);
    bool ok = rc == 0 && out.nbDims == expect.nbDims;
    std::string got;
    for (int32_t d = 0; ok && d < out.nbDims; ++d) {
      int64_t v = -1;
      ok = out.d[d] != nullptr && builder.impl.owns(out.d[d]) && static_cast<const Expr*>(out.d[d])->eval(env, &v) && v == expect.d[d];
      if (pass == 1) ok = ok && out.d[d]->isConstant() && out.d[d]->getConstantValue() == expect.d[d];
      got += (d ? "," : "") + std::to_string(v);
    }
    step(pass == 0 ? "getOutputShapes.symbolic" : "getOutputShapes.constant", ok,
         "rc " + std::to_string(rc) + ", evaluates to [" + got + "], expected " + dims_text(expect));
  }

  // 6. supportsFormatCombination: TensorRT asks position by position, the earlier ones fixed to
  //    what it chose; each position must accept the case's type in linear format.
  std::vector<DynamicPluginTensorDesc> io(nb_in + 1);
  for (int32_t i = 0; i <= nb_in; ++i) {
    const Dims& dims = i < nb_in ? c.inputs[i].dims : expect;
    DynamicPluginTensorDesc& t = io[i];
    t.desc.dims = dims;
    for (int32_t d = 0; d < dims.nbDims; ++d) t.desc.dims.d[d] = -1;  // dynamic at build time
    t.desc.type = c.dtype;
    t.desc.format = TensorFormat::kLINEAR;
    t.desc.scale = 1.f;
    t.min = t.max = t.opt = dims;
  }
  bool formats_ok = true;
  std::string accepted;
  for (int32_t pos = 0; pos <= nb_in; ++pos) {
    int n = 0;
    bool wanted = false;
    for (DataType type : kTypes) {
      for (TensorFormat fmt : kFormats) {
        io[pos].desc.type = type;
        io[pos].desc.format = fmt;
        const bool yes = build->supportsFormatCombination(pos, io.data(), nb_in, 1);
        n += yes;
        if (type == c.dtype && fmt == TensorFormat::kLINEAR) wanted = yes;
        if (yes && fmt != TensorFormat::kLINEAR) formats_ok = false;  // the kernels read linear layouts only
        if (yes && pos > 0 && type != c.dtype) formats_ok = false;    // every tensor shares input 0's type
      }
    }
    io[pos].desc.type = c.dtype;
    io[pos].desc.format = TensorFormat::kLINEAR;
    formats_ok &= wanted;
    accepted += (pos ? "," : "") + std::to_string(n);
  }
  step("supportsFormatCombination", formats_ok,
       std::to_string(nb_in + 1) + " positions x " +
           std::to_string(sizeof(kTypes) / sizeof(kTypes[0]) * sizeof(kFormats) / sizeof(kFormats[0])) +
           " type/format pairs; accepted per position: " + accepted);

  // 7. configurePlugin (dynamic dims, profile min/opt/max) and getWorkspaceSize
  const int32_t rc_conf = build->configurePlugin(io.data(), nb_in, &io[nb_in], 1);
  step("configurePlugin", rc_conf == 0, "rc " + std::to_string(rc_conf));
  const size_t workspace = build->getWorkspaceSize(io.data(), nb_in, &io[nb_in], 1);
  step("getWorkspaceSize", workspace < (size_t(1) << 32), std::to_string(workspace) + " bytes");

  // 8. what the engine stores: getFieldsToSerialize, deep-copied
  auto* rt_build = capability<IPluginV3OneRuntime>(plugin.get(), PluginCapabilityType::kRUNTIME);
  if (!rt_build) return;
  StoredFields stored(rt_build->getFieldsToSerialize());
  step("getFieldsToSerialize", stored.fc.nbFields == (names ? names->nbFields : -1), stored.describe());

  // concrete tensors for the runtime
  std::vector<PluginTensorDesc> in_desc(nb_in);
  for (int32_t i = 0; i < nb_in; ++i) in_desc[i] = io[i].desc, in_desc[i].dims = c.inputs[i].dims;
  PluginTensorDesc out_desc = io[nb_in].desc;
  out_desc.dims = expect;

  // 9. runtime: attachToContext gives the execution context its own plugin
  ResourceContext context;
  std::unique_ptr<IPluginV3> attached(rt_build->attachToContext(&context));
  step("attachToContext", attached != nullptr && attached.get() != plugin.get());
  auto* rt = capability<IPluginV3OneRuntime>(attached.get(), PluginCapabilityType::kRUNTIME);

  // 10. the engine round trip: createPlugin(kRUNTIME) from the stored fields, attached likewise
  std::unique_ptr<IPluginV3> restored(creator->createPlugin(c.op.c_str(), &stored.fc, TensorRTPhase::kRUNTIME));
  step("createPlugin.fromSerialized", restored != nullptr, stored.describe());
  auto* restored_rt = capability<IPluginV3OneRuntime>(restored.get(), PluginCapabilityType::kRUNTIME);
  std::unique_ptr<IPluginV3> restored_attached(restored_rt ? restored_rt->attachToContext(&context) : nullptr);
  step("attachToContext.fromSerialized", restored_attached != nullptr);
  auto* rt2 = capability<IPluginV3OneRuntime>(restored_attached.get(), PluginCapabilityType::kRUNTIME);
  if (restored_rt) {
    StoredFields again(restored_rt->getFieldsToSerialize());
    bool same = again.fc.nbFields == stored.fc.nbFields;
    for (int32_t i = 0; same && i < again.fc.nbFields; ++i) same = again.names[i] == stored.names[i] && again.data[i] == stored.data[i];
    step("getFieldsToSerialize.fromSerialized", same, "the re-created plugin stores the same fields");
  }

  // 11. enqueue, on both plugins, when a GPU is here
  if (!with_enqueue || !rt || !rt2) {
    step("enqueue", !with_enqueue, with_enqueue ? "not reached: no runtime interface" : "skipped: no CUDA device");
  } else {
    std::vector<DeviceBuffer> inputs(nb_in);
    bool staged = true;
    for (int32_t i = 0; i < nb_in && staged; ++i) {
      std::vector<char> host = read_file(c.inputs[i].path);
      inputs[i].bytes = static_cast<size_t>(volume(c.inputs[i].dims)) * elem_size(c.dtype);
      staged = host.size() == inputs[i].bytes && cudaMalloc(&inputs[i].ptr, inputs[i].bytes ? inputs[i].bytes : 1) == cudaSuccess &&
               cudaMemcpy(inputs[i].ptr, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess;
    }
    step("inputs to device", staged);
    if (staged) {
      std::vector<char> first, second;
      const bool a = run_enqueue("attached", rt, c, in_desc, out_desc, inputs, workspace, c.out, &first);
      const bool b = run_enqueue("fromSerialized", rt2, c, in_desc, out_desc, inputs, workspace, c.out + ".again", &second);
      if (a && b) step("outputs identical", first == second, "enqueue of the plugin and of its re-creation from the stored fields");
    }
  }

  // 12. destroy (TensorRT deletes what it was given), in the order an engine tears down
  restored_attached.reset();
  restored.reset();
  attached.reset();
  plugin.reset();
  step("destroy", true);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: trt_driver LIBDEPLOYFUSE_TRT.so MANIFEST [--no-enqueue]\n";
    return 2;
  }
  bool with_enqueue = !(argc > 3 && std::string(argv[3]) == "--no-enqueue");
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) with_enqueue = false;
  std::vector<Case> cases;
  try {
    cases = read_manifest(argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "trt_driver: " << e.what() << "\n";
    return 2;
  }
  LoggerFinder finder;
  Library lib;
  bool all_ok = load_library(argv[1], &finder, &lib);
  std::cout << "{\"case\":\"-\",\"op\":\"-\",\"step\":\"device\",\"ok\":true,\"detail\":"
            << quoted(with_enqueue ? "CUDA devices: " + std::to_string(devices) : std::string("no CUDA device: ") + cudaGetErrorString(err))
            << ",\"enqueue\":" << (with_enqueue ? "true" : "false") << "}" << std::endl;
  if (!all_ok) return 1;
  for (const Case& c : cases) {
    drive(lib, c, with_enqueue);
    std::cout << "{\"case\":" << quoted(c.id) << ",\"op\":" << quoted(c.op)
              << ",\"summary\":true,\"ok\":" << (g_failed.empty() ? "true" : "false") << ",\"failed\":[";
    for (size_t i = 0; i < g_failed.size(); ++i) std::cout << (i ? "," : "") << quoted(g_failed[i]);
    std::cout << "]}" << std::endl;
    all_ok &= g_failed.empty();
  }
  return all_ok ? 0 : 1;
}
