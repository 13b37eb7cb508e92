// GemmAct for ONNX Runtime (see common/ort_adapter.h). On the CUDA EP each kernel instance keeps its
// own cuBLASLt runner (handle and plans) and takes the algorithm's workspace from ONNX Runtime's
// allocator for the device, so a Run neither mallocs nor synchronises (CUDA-graph capture safe).
#pragma once
#include <vector>

#include "common/ort_adapter.h"
#include "gemm_act/gemm_act.h"
#ifdef DEPLOYFUSE_WITH_CUDA
#include <memory>

#include "gemm_act/gemm_act.cuh"
#endif

namespace deployfuse {
namespace ort {

#ifdef DEPLOYFUSE_WITH_CUDA
// Workspace from ONNX Runtime's device allocator, given back when the launch is queued (the arena
// is stream-ordered on the compute stream).
class OrtScratch final : public GemmActScratch {
 public:
  explicit OrtScratch(const Ort::KernelContext& ctx) : ctx_(ctx) {}
  ~OrtScratch() {
    if (ptr_ != nullptr) allocator_->Free(allocator_, ptr_);
    if (allocator_ != nullptr) Ort::GetApi().ReleaseAllocator(allocator_);  // KernelContext_GetAllocator hands out an owned wrapper
  }
  void* get(size_t bytes) override {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
    Ort::MemoryInfo info("Cuda", OrtDeviceAllocator, device, OrtMemTypeDefault);
    if (allocator_ == nullptr) allocator_ = ctx_.GetAllocator(*static_cast<const OrtMemoryInfo*>(info));
    ptr_ = allocator_ ? allocator_->Alloc(allocator_, bytes) : nullptr;
    return ptr_;
  }

 private:
  const Ort::KernelContext& ctx_;
  OrtAllocator* allocator_ = nullptr;
  void* ptr_ = nullptr;
};

// The CUDA side of both cuBLASLt ops: cuBLASLt present, K > 0, scratch from ORT's allocator, then
// `launch(tag, scratch)` for the node's element type (see launch_cuda).
template <typename Launch>
void launch_cublaslt(const char* op, const Call& c, int64_t k, Launch&& launch) {
  if (const char* why = gemm_act_unavailable()) fail(op, why);
  if (k == 0) fail(op, "K must be positive on CUDA");
  OrtScratch scratch(c.ctx);
  launch_cuda(op, c, [&](auto* tag) { return launch(tag, scratch); });
}
#endif

struct GemmAct : GemmActAttrs {
  using GemmActAttrs::GemmActAttrs;
  void Run(Call& c, bool on_cuda) const {
    Sizes s;
    const Inputs in = sized_inputs(*this, c, &s);
    auto y = gemm_output(c, in[0], s.n);
    const void* residual = in.count() > 3 ? in[3].data : nullptr;
    if (!on_cuda) {
      gemm_act_cpu(in[0].as<float>(), in[1].as<float>(), in[2].as<float>(), static_cast<const float*>(residual),
                   y.GetTensorMutableData<float>(), s.m, s.n, s.k, act);
      return;
    }
#ifdef DEPLOYFUSE_WITH_CUDA
    launch_cublaslt(Spec::kName, c, s.k, [&](auto* tag, GemmActScratch& scratch) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return launch_gemm_act<T>(*runner, static_cast<cudaStream_t>(c.stream), GemmActProblem{s.m, s.n, s.k, act, algo}, in[0].as<T>(),
                                in[1].as<T>(), in[2].as<T>(), static_cast<const T*>(residual), static_cast<T*>(y.GetTensorMutableRawData()),
                                scratch);
    });
#endif
  }

#ifdef DEPLOYFUSE_WITH_CUDA
  std::shared_ptr<GemmActRunner> runner = make_gemm_act_runner();  // no CUDA call until the first Run
#endif
};

}  // namespace ort
}  // namespace deployfuse
