// Native bf16 GEMMs for the CPU kernels: oneDNN's matmul primitive (its BRGEMM kernels use
// AVX512_BF16's dot products, f32 accumulation, one rounding into the output) on CPUs that have
// AVX512_BF16; elsewhere the kernels keep widening bf16 to f32 for OpenBLAS.
//
// Why oneDNN: Debian's OpenBLAS 0.3.21 exports no sbgemm, and oneDNN (Debian's libdnnl-dev) is
// what PyTorch's CPU bf16 GEMMs use; on a 2-core Zen 4 its bf16 matmul runs ~400 GFLOP/s against
// ~200 for f32 sgemm. MT_CPU_BF16_GEMM=widen turns the native path off (A/B runs, debugging).
#pragma once

#include <cstdint>

#include "runtime/core/dtype.h"

namespace mt::runtime::cpu {

// True when this CPU has AVX512_BF16 and MT_CPU_BF16_GEMM is not "widen" (read once).
bool native_bf16_gemm_enabled();

// Overrides the above for the rest of the process (tests compare both paths).
void set_native_bf16_gemm_enabled(bool enabled);

// A matrix operand: element (i, j) is at data[i * row_stride + j * col_stride]; one of the two
// strides must be 1 (a row-major matrix or a transposed one), as for BLAS.
struct Bf16Matrix {
  const bfloat16* data;
  int64_t row_stride, col_stride;
};

// c[m, n] = alpha * (a[m, k] @ b[k, n]) + beta * c, accumulated in f32 and rounded once into c,
// which is bf16 or f32 (`c_dtype`), row-major with leading dimension ldc. Runs on the calling
// thread's OpenMP team (single-threaded inside a parallel region). Requires
// native_bf16_gemm_enabled().
void bf16_gemm(int64_t m, int64_t n, int64_t k, Bf16Matrix a, Bf16Matrix b, void* c,
               DType c_dtype, int64_t ldc, float alpha = 1.0f, float beta = 0.0f);

}  // namespace mt::runtime::cpu
