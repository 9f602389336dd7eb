// GEMMs through oneDNN's matmul primitive, for the CPU kernels on CPUs with AVX-512:
//   - bf16 (AVX512_BF16): native bf16 dot products, f32 accumulation, one rounding into the
//     output. Without it the kernels widen bf16 to f32 for OpenBLAS.
//   - f32 (AVX512F): oneDNN's AVX-512 kernels. Debian's OpenBLAS 0.3.21 picks its AVX2 (Haswell)
//     kernels on CPUs it does not know, such as AMD Zen 5, at half the speed; elsewhere the
//     kernels keep OpenBLAS.
// Why oneDNN: Debian's OpenBLAS exports no bf16 GEMM (sbgemm), and oneDNN (Debian's libdnnl-dev)
// is what PyTorch's CPU bf16 GEMMs use. On a 2-core Zen 5 its matmul runs ~900 GFLOP/s in bf16
// and ~480 in f32, against ~250 for OpenBLAS's f32 as it detects that CPU.
// MT_CPU_BF16_GEMM=widen and MT_CPU_F32_GEMM=openblas turn each off (A/B runs, debugging).
#pragma once

#include <cstdint>

#include "runtime/core/dtype.h"

namespace mt::runtime::cpu {

// Whether the kernels run bf16 / f32 GEMMs through oneDNN: the CPU has the instructions and the
// environment does not say otherwise (read once).
bool onednn_bf16_gemm_enabled();
bool onednn_f32_gemm_enabled();

// Override the above for the rest of the process (tests compare the paths). Turning one on
// throws on a CPU without its instructions.
void set_onednn_bf16_gemm_enabled(bool enabled);
void set_onednn_f32_gemm_enabled(bool enabled);

// A matrix operand: element (i, j) is at data[i * row_stride + j * col_stride]; one of the two
// strides must be 1 (a row-major matrix or a transposed one), as for BLAS.
struct GemmOperand {
  const void* data;
  int64_t row_stride, col_stride;
};

// c[m, n] = alpha * (a[m, k] @ b[k, n]) + beta * c with a and b of dtype `in` (bf16 or f32),
// accumulated in f32 and rounded once into c, which is bf16 or f32 (`out`), row-major with
// leading dimension ldc; k > 0. Runs on the calling thread's OpenMP team (single-threaded inside
// a parallel region); several threads may call it at once.
void onednn_gemm(DType in, int64_t m, int64_t n, int64_t k, GemmOperand a, GemmOperand b, void* c,
                 DType out, int64_t ldc, float alpha = 1.0f, float beta = 0.0f);

}  // namespace mt::runtime::cpu
