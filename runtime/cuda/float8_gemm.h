// The scaled FP8 GEMM's choice of path on the current GPU (runtime/cuda/float8_gemm.cu), for
// tests and diagnostics.
#pragma once

#include "runtime/core/dtype.h"
#include "runtime/kernels/float8.h"

namespace mt::runtime::cuda {

// Whether rowwise FP8 GEMMs (a row scale per operand) of these formats, output dtype and
// accumulation apply their scales in cuBLASLt's epilogue (outer-vector scale mode) on the current
// GPU: the mode exists in this cuBLASLt, runs here, and gave the exact answer on a check GEMM.
// Otherwise they take an unscaled GEMM and a second kernel. Decided once per process and key.
bool float8_rowwise_scales_in_epilogue(Float8Format a_format, Float8Format b_format, DType out,
                                       bool fast_accum);

}  // namespace mt::runtime::cuda
