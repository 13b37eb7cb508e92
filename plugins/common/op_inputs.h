// The inputs of one op call as every caller hands them over: the ONNX Runtime and TensorRT
// adapters (common/ort_adapter.h, common/trt_plugin.h) and the GPU checks' C ABI. An op reads its
// sizes from them once (<Op>Attrs::sizes, framework-free), so the two runtimes cannot disagree.
#pragma once
#include <cstdint>
#include <stdexcept>

namespace deployfuse {

constexpr int kMaxRank = 8;    // = TensorRT's Dims::MAX_DIMS
constexpr int kMaxInputs = 9;  // Fp8Mlp's

// An input's element type (spec::<Op>::kInputTypes, from OpSpec.input_types): kT, the op's float
// type (fp32/fp16/bf16, also its output's), or a type the spec fixes.
enum class InputType : int { kT, kFloat, kFloat8E4M3FN, kInt64 };

// One linear (contiguous) tensor: its data and dims.
struct Tensor {
  const void* data = nullptr;
  int rank = 0;
  int64_t dims[kMaxRank] = {};

  // The product of dims[begin, end).
  int64_t size(int begin, int end) const {
    int64_t n = 1;
    for (int i = begin; i < end; ++i) n *= dims[i];
    return n;
  }
  int64_t elements() const { return size(0, rank); }
  // Whether the input was given: an absent one has no data and rank 0, a given empty one may have no data (ORT's CUDA EP
  // allocates none) but has a dim.
  bool present() const { return data != nullptr || rank > 0; }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
  // The data, or null for a tensor of no elements (the fp8 GEMMs' Bias given empty: none added).
  template <typename T>
  const T* as_or_null() const {
    return elements() == 0 ? nullptr : as<T>();
  }
};

// The inputs of a call in the spec's order: absent optional inputs at the end left out, one before a
// present input kept without data (data null, rank 0).
class Inputs {
 public:
  // Appends an input; throws std::invalid_argument past kMaxInputs inputs or kMaxRank dims.
  template <typename Dim>
  void add(const void* data, const Dim* dims, int rank) {
    if (count_ == kMaxInputs) throw std::invalid_argument("too many inputs");
    if (rank < 0 || rank > kMaxRank) throw std::invalid_argument("an input's rank is above 8");
    Tensor& t = tensors_[count_++];
    t.data = data;
    t.rank = rank;
    for (int i = 0; i < rank; ++i) t.dims[i] = static_cast<int64_t>(dims[i]);
  }
  int count() const { return count_; }
  const Tensor& operator[](int i) const { return tensors_[i]; }

 private:
  int count_ = 0;
  Tensor tensors_[kMaxInputs];
};

}  // namespace deployfuse
