// Error checks for CUDA runtime, cuBLAS(Lt) and cuDNN calls: a failed call throws mt::Error naming
// the call, the error and where it was made. Kernel launches are followed by MT_CUDA_CHECK_LAUNCH()
// so a bad launch configuration is reported at the launch, not at some later call.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "runtime/core/error.h"

#define MT_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    const cudaError_t mt_cuda_err_ = (expr);                                                  \
    if (mt_cuda_err_ != cudaSuccess) [[unlikely]] {                                           \
      MT_FAIL("CUDA error ", cudaGetErrorName(mt_cuda_err_), " (", cudaGetErrorString(mt_cuda_err_), \
              ") in ", #expr, " at ", __FILE__, ":", __LINE__);                               \
    }                                                                                         \
  } while (0)

#define MT_CUDA_CHECK_LAUNCH() MT_CUDA_CHECK(cudaGetLastError())

#define MT_CUBLAS_CHECK(expr)                                                              \
  do {                                                                                     \
    const cublasStatus_t mt_cublas_st_ = (expr);                                           \
    if (mt_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                             \
      MT_FAIL("cuBLAS error ", cublasGetStatusName(mt_cublas_st_), " (",                  \
              cublasGetStatusString(mt_cublas_st_), ") in ", #expr, " at ", __FILE__, ":", \
              __LINE__);                                                                   \
    }                                                                                      \
  } while (0)
