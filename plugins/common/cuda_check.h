// Error plumbing for the CUDA launchers: they return cudaError_t and never throw.
#pragma once
#include <cuda_runtime.h>

#define DF_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    cudaError_t df_err_ = (expr);                \
    if (df_err_ != cudaSuccess) return df_err_;  \
  } while (0)
