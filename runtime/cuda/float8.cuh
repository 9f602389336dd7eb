// Pieces the float8 CUDA files share (runtime/cuda/float8.cu: casts; float8_gemm.cu: GEMMs).
#pragma once

#include <cuda_bf16.h>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace mt::runtime::cuda {

// Calls f(T{}) with T = float or __nv_bfloat16 for dtype; other dtypes are an error naming op.
template <class F>
void dispatch_f32_bf16(DType dtype, const char* op, F&& f) {
  if (dtype == DType::F32) return f(float{});
  if (dtype == DType::BF16) return f(__nv_bfloat16{});
  MT_FAIL(op, ": expected f32 or bf16, got ", dtype_name(dtype));
}

}  // namespace mt::runtime::cuda
