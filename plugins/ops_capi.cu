// A C ABI over the ops' TensorRT adapters (raw device pointers, dtype code 0=fp32 1=fp16 2=bf16),
// so the GPU checks and benchmarks drive every registered op from Python (ctypes + torch tensors)
// through the same enqueue TensorRT runs. Generic over trt::Registered (deployfuse_trt_ops.h,
// generated from the op registry): nothing here changes when an op is added.
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>

#include "common/dtype_dispatch.h"
#include "common/trt_plugin.h"
#include "deployfuse_trt_ops.h"
#include "fp8_gemm_act/fp8_gemm_act.cuh"
#include "fp8_mlp/fp8_mlp.cuh"
#include "fused_mha/fused_mha.cuh"
#include "skip_layer_norm_fp8/skip_layer_norm_fp8.cuh"

namespace {

using namespace deployfuse;

constexpr int kUnknownOp = -1;   // no registered op has that name
constexpr int kBadRequest = -2;  // attributes or input descriptions rejected (df_last_error says why)

thread_local std::string g_last_error;

// op.enqueue as TensorRT calls it, with a stream-ordered workspace when the adapter wants one.
template <typename Op>
cudaError_t enqueue(const Op& op, const trt::PluginTensorDesc* desc, int n_inputs, const void* const* inputs, void* y,
                    cudaStream_t stream) {
  if constexpr (trt::HasWorkspace<Op>::value) {  // its enqueue then takes one (common/trt_plugin.h)
    void* workspace = nullptr;
    cudaError_t err = cudaMallocAsync(&workspace, Op::kWorkspaceBytes, stream);
    if (err != cudaSuccess) return err;
    err = op.enqueue(desc[0].type, desc, n_inputs, inputs, y, workspace, stream);
    const cudaError_t freed = cudaFreeAsync(workspace, stream);
    return err != cudaSuccess ? err : freed;
  } else {
    return op.enqueue(desc[0].type, desc, n_inputs, inputs, y, stream);
  }
}

nvinfer1::DataType trt_type(int dtype) {
  switch (static_cast<DType>(dtype)) {
    case DType::kFloat: return nvinfer1::DataType::kFLOAT;
    case DType::kHalf: return nvinfer1::DataType::kHALF;
    case DType::kBFloat16: return nvinfer1::DataType::kBF16;
    default: return nvinfer1::DataType::kINT8;  // not one the adapters take: they answer cudaErrorInvalidValue
  }
}

// One call of Op: attributes from the values given in the spec's order, inputs as linear tensors.
template <typename Op>
int run_op(int dtype, void* stream, int n_inputs, const void* const* inputs, const int64_t* const* dims, const int* ranks, void* y,
           const double* numbers, const char* const* texts) {
  if (n_inputs < Op::Spec::kRequiredInputs || n_inputs > Op::Spec::kInputs || n_inputs > kMaxInputs) {
    g_last_error = std::string(Op::Spec::kName) + ": wrong number of inputs";
    return kBadRequest;
  }
  trt::PluginTensorDesc desc[kMaxInputs] = {};
  for (int i = 0; i < n_inputs; ++i) {
    if (ranks[i] < 0 || ranks[i] > nvinfer1::Dims::MAX_DIMS) {
      g_last_error = std::string(Op::Spec::kName) + ": input rank out of range";
      return kBadRequest;
    }
    desc[i].dims.nbDims = ranks[i];
    for (int d = 0; d < ranks[i]; ++d) desc[i].dims.d[d] = dims[i][d];
    desc[i].format = nvinfer1::TensorFormat::kLINEAR;
    desc[i].type = trt_type(dtype);
  }
  try {
    const Op op(AttrValues::read(Op::Spec::kAttrs, [&](const AttrSpec& spec, double* number, std::string* text) {
      const auto i = &spec - Op::Spec::kAttrs;
      *number = numbers[i];
      if (texts[i] != nullptr) *text = texts[i];
      return true;
    }));
    return static_cast<int>(enqueue(op, desc, n_inputs, inputs, y, static_cast<cudaStream_t>(stream)));
  } catch (const std::exception& e) {
    g_last_error = std::string(Op::Spec::kName) + ": " + e.what();
    return kBadRequest;
  }
}

template <typename... Ops>
int run_named(OpList<Ops...>, const char* op, int dtype, void* stream, int n_inputs, const void* const* inputs, const int64_t* const* dims,
              const int* ranks, void* y, const double* numbers, const char* const* texts) {
  int rc = kUnknownOp;
  ((std::strcmp(op, Ops::Spec::kName) == 0 && (rc = run_op<Ops>(dtype, stream, n_inputs, inputs, dims, ranks, y, numbers, texts), true)) ||
   ...);
  if (rc == kUnknownOp) g_last_error = std::string("no registered op named ") + op;
  return rc;
}

}  // namespace

#define DF_EXPORT extern "C" __attribute__((visibility("default")))

// Runs the registered op `op` on n_inputs linear tensors (inputs[i] of dims[i][0..ranks[i])) into
// y (the output: the shape and dtype the op gives it). numbers/texts: one value per attribute of
// the op's spec, in its order (texts[i] for string attributes, numbers[i] for the others).
// Returns 0, a cudaError_t, or kUnknownOp / kBadRequest (df_last_error says why).
DF_EXPORT int df_run(const char* op, int dtype, void* stream, int n_inputs, const void* const* inputs, const int64_t* const* dims,
                     const int* ranks, void* y, const double* numbers, const char* const* texts) {
  g_last_error.clear();
  return run_named(trt::Registered{}, op, dtype, stream, n_inputs, inputs, dims, ranks, y, numbers, texts);
}

// Why the last df_run on this thread returned kUnknownOp or kBadRequest (empty otherwise).
DF_EXPORT const char* df_last_error() { return g_last_error.c_str(); }

// FusedMHA on an explicit MhaShape: a mask of any element strides (mask_stride), which no runtime
// passes (their tensors are contiguous) but the tensor-core kernels' mask paths take (the GPU check's
// padded, offset and strided mask layouts), and Q, K, V rows q_ld, k_ld, v_ld apart (the GPU check's
// packed_qkv thirds, which df_run's TensorRT adapter refuses). yq non-null: YQ too (float8 bytes, y_scale a device float32),
// which df_run's TensorRT adapter also refuses; y may then be null.
DF_EXPORT int df_fused_mha(int dtype, void* stream, const void* q, const void* k, const void* v, const void* mask, void* y,
                           const MhaShape* shape, const float* y_scale, void* yq) {
  return static_cast<int>(with_dtype(static_cast<DType>(dtype), [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return launch_fused_mha<T>(static_cast<cudaStream_t>(stream), static_cast<const T*>(q), static_cast<const T*>(k),
                               static_cast<const T*>(v), static_cast<const T*>(mask), static_cast<T*>(y), *shape,
                               MhaYq{y_scale, static_cast<uint8_t*>(yq)});
  }));
}

// The cuBLASLt runner of the two GemmAct entries below, one for the process (df_run makes an adapter,
// and so a runner, per call): a problem's plan, made by whichever entry sees it first, serves both,
// so its heuristic is queried once and launches can be captured in a CUDA graph.
namespace {
GemmActRunner& process_gemm_act_runner() {
  static const auto runner = make_gemm_act_runner();
  return *runner;
}
}  // namespace

// GemmAct on the process's runner, as the algorithm tuner (deployfuse/rewrite/gemm_tuning.py) and
// bench/gemm_gpu.py time it. workspace: ws_bytes of device memory.
DF_EXPORT int df_gemm_act(int dtype, void* stream, const void* x, const void* w, const void* bias, const void* residual, void* y, int64_t m,
                          int64_t n, int64_t k, int act, int algo, void* workspace, size_t ws_bytes) {
  FixedScratch scratch(workspace, ws_bytes);
  return static_cast<int>(with_dtype(static_cast<DType>(dtype), [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return launch_gemm_act<T>(process_gemm_act_runner(), static_cast<cudaStream_t>(stream),
                              GemmActProblem{m, n, k, static_cast<Act>(act), algo}, static_cast<const T*>(x), static_cast<const T*>(w),
                              static_cast<const T*>(bias), static_cast<const T*>(residual), static_cast<T*>(y), scratch);
  }));
}

// How many cuBLASLt heuristic candidates GemmAct's `algo` may index for this problem (the pointers'
// alignments count); negative: a cudaError_t.
DF_EXPORT int df_gemm_act_candidates(int dtype, const void* x, const void* w, const void* bias, const void* residual, const void* y,
                                     int64_t m, int64_t n, int64_t k, int act) {
  int count = 0;
  const cudaError_t err = with_dtype(static_cast<DType>(dtype), [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    count = gemm_act_candidates<T>(process_gemm_act_runner(), GemmActProblem{m, n, k, static_cast<Act>(act), -1}, static_cast<const T*>(x),
                                   static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<const T*>(residual),
                                   static_cast<const T*>(y));
    return cudaSuccess;
  });
  return err != cudaSuccess ? -static_cast<int>(err) : count;
}

// Fp8GemmAct (an ONNX Runtime op only: no TensorRT plugin, so not behind df_run) on the process's
// runner, as bench/fp8_gemm_gpu.py checks and times it. x_scale, w_scale: device pointers to one
// float32 each; w: float8e4m3fn [n, k]; bias [n] in dtype or NULL (none); options: bit 0 the fast_accum attribute (1 fast, 0 full fp32
// accumulation), bit 1 (kOptionFp8X) X given in float8e4m3fn [m, k], already q(X, x_scale) (SkipLayerNormFp8's YQ; k a multiple of 16, else
// cudaErrorNotSupported); scratch: scratch_bytes of 256-byte aligned device memory (at least df_fp8_gemm_act_scratch_bytes: X's
// float8 copy, the padded copies of W, Bias and Y where needed; a cuBLASLt workspace only under DEPLOYFUSE_FP8_GEMM_WORKSPACE=1).
namespace {
constexpr int kOptionFastAccum = 1, kOptionFp8X = 2;

Fp8GemmActRunner& process_fp8_gemm_act_runner() {
  static const auto runner = make_fp8_gemm_act_runner();
  return *runner;
}
}  // namespace

DF_EXPORT int df_fp8_gemm_act(int dtype, void* stream, const void* x, const void* x_scale, const void* w, const void* w_scale,
                              const void* bias, void* y, int64_t m, int64_t n, int64_t k, int act, int algo, int options, void* scratch,
                              size_t scratch_bytes) {
  FixedScratch fixed(scratch, scratch_bytes);
  Fp8GemmActProblem p{m, n, k, static_cast<Act>(act), algo, (options & kOptionFastAccum) != 0};
  p.x_fp8 = (options & kOptionFp8X) != 0;
  if (p.x_fp8 && k % kFp8GemmActKMultiple != 0) return static_cast<int>(cudaErrorNotSupported);
  return static_cast<int>(with_dtype(static_cast<DType>(dtype), [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return launch_fp8_gemm_act<T>(process_fp8_gemm_act_runner(), static_cast<cudaStream_t>(stream), p, x,
                                  static_cast<const float*>(x_scale), static_cast<const uint8_t*>(w), static_cast<const float*>(w_scale),
                                  static_cast<const T*>(bias), static_cast<T*>(y), fixed);
  }));
}

// SkipLayerNormFp8 (ONNX Runtime only) as bench/skip_layer_norm_fp8_gpu.py checks and times it: x, y, sum [rows, cols], skip
// [skip_rows, cols] (0: rows; row r reads skip[r % skip_rows]) and gamma, beta, bias [cols] in dtype, yq float8e4m3fn [rows, cols],
// y_scale a device float32; with ids (int64 [rows]) x is a [table_rows, cols] table looked up by them; skip, ids, y, yq, sum may be null.
DF_EXPORT int df_skip_layer_norm_fp8(int dtype, void* stream, const void* x, const void* skip, const void* gamma, const void* beta,
                                     const void* bias, const void* y_scale, void* y, void* yq, void* sum, int64_t rows, int64_t cols,
                                     float epsilon, const void* ids, int64_t table_rows, int64_t skip_rows) {
  return static_cast<int>(with_dtype(static_cast<DType>(dtype), [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return launch_skip_layer_norm_fp8<T>(
        static_cast<cudaStream_t>(stream), static_cast<const T*>(x), static_cast<const T*>(skip), static_cast<const T*>(gamma),
        static_cast<const T*>(beta), static_cast<const T*>(bias), static_cast<const float*>(y_scale), static_cast<T*>(y),
        static_cast<uint8_t*>(yq), static_cast<T*>(sum), rows, cols, epsilon, static_cast<const int64_t*>(ids), table_rows, skip_rows);
  }));
}

// Fp8GemmAct's quantize pass alone (bench/fp8_gemm_gpu.py times it): q [m, k rounded up to 16] float8e4m3fn
// = e4m3(x [m, k] / *x_scale), zeros past k.
DF_EXPORT int df_fp8_quantize_e4m3(int dtype, void* stream, const void* x, const void* x_scale, void* q, int64_t m, int64_t k) {
  return static_cast<int>(with_dtype(static_cast<DType>(dtype), [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return fp8_quantize_e4m3<T>(static_cast<cudaStream_t>(stream), static_cast<const T*>(x), static_cast<const float*>(x_scale),
                                static_cast<uint8_t*>(q), m, k);
  }));
}

DF_EXPORT size_t df_fp8_gemm_act_scratch_bytes(int dtype, int64_t m, int64_t n, int64_t k) {
  size_t bytes = 0;
  with_dtype(static_cast<DType>(dtype), [&](auto* t) {
    bytes = fp8_gemm_act_scratch_bytes(m, n, k, sizeof(*t));
    return cudaSuccess;
  });
  return bytes;
}

// How many cuBLASLt heuristic candidates Fp8GemmAct's `algo` may index for this problem; negative: a cudaError_t.
DF_EXPORT int df_fp8_gemm_act_candidates(int dtype, const void* x_scale, const void* w, const void* w_scale, const void* bias,
                                         const void* y, int64_t m, int64_t n, int64_t k, int act, int fast_accum) {
  int count = 0;
  const cudaError_t err = with_dtype(static_cast<DType>(dtype), [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    count =
        fp8_gemm_act_candidates<T>(process_fp8_gemm_act_runner(), Fp8GemmActProblem{m, n, k, static_cast<Act>(act), -1, fast_accum != 0},
                                   static_cast<const float*>(x_scale), static_cast<const uint8_t*>(w), static_cast<const float*>(w_scale),
                                   static_cast<const T*>(bias), static_cast<const T*>(y));
    return cudaSuccess;
  });
  return err != cudaSuccess ? -static_cast<int>(err) : count;
}

// Fp8Mlp (ONNX Runtime only, as Fp8GemmAct) on the process's Fp8GemmAct runner, as bench/fp8_gemm_gpu.py checks and times it:
// x [m, k] and y [m, n2] in dtype, the scales device pointers to one float32 each, w1 float8e4m3fn [n1, k], w2 [n2, n1], b1 [n1]
// and b2 [n2] in dtype, each or NULL (none); act: FC1's activation; scratch: scratch_bytes of 256-byte aligned device memory (at least
// df_fp8_mlp_scratch_bytes); algo1, algo2: FC1's and FC2's candidate (-1: the heuristic's choice; df_fp8_mlp_candidates counts
// them); options as df_fp8_gemm_act's (fast accumulation, X given in float8 [m, k]); h_scale_inverse: a device float32 holding
// 1 / *h_scale (what the ORT adapter keeps for a constant HScale), or NULL: the launch computes it (with X given in float8, one more
// kernel). cudaErrorNotSupported for n1 (or, X given in float8, k) not a multiple of 16.
DF_EXPORT int df_fp8_mlp(int dtype, void* stream, const void* x, const void* x_scale, const void* w1, const void* w1_scale, const void* b1,
                         const void* h_scale, const void* w2, const void* w2_scale, const void* b2, void* y, int64_t m, int64_t k,
                         int64_t n1, int64_t n2, int act, int algo1, int algo2, int options, void* scratch, size_t scratch_bytes,
                         const void* h_scale_inverse) {
  FixedScratch fixed(scratch, scratch_bytes);
  const Fp8MlpProblem p{m, k, n1, n2, static_cast<Act>(act), (options & kOptionFastAccum) != 0, algo1, algo2, (options & kOptionFp8X) != 0};
  return static_cast<int>(with_dtype(static_cast<DType>(dtype), [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return launch_fp8_mlp<T>(process_fp8_gemm_act_runner(), static_cast<cudaStream_t>(stream), p, x, static_cast<const float*>(x_scale),
                             static_cast<const uint8_t*>(w1), static_cast<const float*>(w1_scale), static_cast<const T*>(b1),
                             static_cast<const float*>(h_scale), static_cast<const uint8_t*>(w2), static_cast<const float*>(w2_scale),
                             static_cast<const T*>(b2), static_cast<T*>(y), fixed, static_cast<const float*>(h_scale_inverse));
  }));
}

// How many cuBLASLt heuristic candidates Fp8Mlp's algo1 and algo2 may index for this problem, into *fc1 and *fc2 (the plans
// df_fp8_mlp runs with these pointers: FC1's writes H in float8); 0, else the cudaError_t df_fp8_mlp would answer.
DF_EXPORT int df_fp8_mlp_candidates(int dtype, const void* x_scale, const void* w1, const void* w1_scale, const void* b1,
                                    const void* h_scale, const void* w2, const void* w2_scale, const void* b2, const void* y, int64_t m,
                                    int64_t k, int64_t n1, int64_t n2, int act, int fast_accum, int* fc1, int* fc2) {
  return static_cast<int>(with_dtype(static_cast<DType>(dtype), [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return fp8_mlp_candidates<T>(process_fp8_gemm_act_runner(), Fp8MlpProblem{m, k, n1, n2, static_cast<Act>(act), fast_accum != 0},
                                 static_cast<const float*>(x_scale), static_cast<const uint8_t*>(w1), static_cast<const float*>(w1_scale),
                                 static_cast<const T*>(b1), static_cast<const float*>(h_scale), static_cast<const uint8_t*>(w2),
                                 static_cast<const float*>(w2_scale), static_cast<const T*>(b2), static_cast<const T*>(y), fc1, fc2);
  }));
}

DF_EXPORT size_t df_fp8_mlp_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n1, int64_t n2) {
  size_t bytes = 0;
  with_dtype(static_cast<DType>(dtype), [&](auto* t) {
    bytes = fp8_mlp_scratch_bytes(Fp8MlpProblem{m, k, n1, n2, Act::kNone}, sizeof(*t));
    return cudaSuccess;
  });
  return bytes;
}
