// Whether a kernel's code on this device was compiled for at least a given architecture. A build
// without it (CMAKE_CUDA_ARCHITECTURES=75, say) still launches on a newer GPU by JIT-compiling the
// older PTX, where an arch-guarded body (`#if __CUDA_ARCH__ >= 800`) is empty or traps; launchers
// ask first and take their portable path instead.
#pragma once
#include <cuda_runtime.h>

#include <atomic>

namespace deployfuse {

// One call site's answer, cached per device (the first 64 ordinals; others ask every time).
class ArchCheck {
 public:
  bool operator()(const void* kernel, int arch) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return cleared(false);
    int state = device >= 0 && device < 64 ? state_[device].load() : 0;  // 0 unknown, 1 yes, 2 no
    if (state == 0) {
      cudaFuncAttributes attr;
      if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) return cleared(false);
      state = attr.ptxVersion >= arch ? 1 : 2;
      if (device >= 0 && device < 64) state_[device].store(state);
    }
    return state == 1;
  }

 private:
  static bool cleared(bool v) {
    cudaGetLastError();  // not sticky: leave no error behind for the caller's launch checks
    return v;
  }
  std::atomic<int> state_[64] = {};
};

}  // namespace deployfuse
