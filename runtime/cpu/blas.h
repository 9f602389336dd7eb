// The CPU kernels' thin layer over CBLAS (OpenBLAS): one row-major GEMM name for f32 and f64, and
// the check that a size fits BLAS's 32-bit integers.
#pragma once

#include <cblas.h>

#include <climits>
#include <cstdint>

#include "runtime/core/error.h"

namespace mt::runtime::cpu {

// v as a BLAS int; throws naming `op` when it does not fit.
inline int blas_int(int64_t v, const char* op) {
  MT_CHECK(v <= INT_MAX, op, ": dimension or leading dimension ", v,
           " is too large for this BLAS (32-bit integers)");
  return int(v);
}

// c = op(a) @ op(b), row-major (beta 0).
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, const float* a,
                 int lda, const float* b, int ldb, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, const double* a,
                 int lda, const double* b, int ldb, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}

}  // namespace mt::runtime::cpu
