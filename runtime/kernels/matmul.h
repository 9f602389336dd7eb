// Kernel table of the matmul family (the op is runtime/ops/matmul.h).
//
// matmul_kernel(device, a, b, out): out[batch..., M, N] = a[batch..., M, K] @ b[batch..., K, N].
// - a and b may have any strides (transposed views included): the kernel maps each operand onto
//   BLAS's (transpose, leading dimension) when its layout allows, and copies it otherwise.
// - Their batch dims broadcast to out's (numpy rules; the op has validated the shapes).
// - out is contiguous, of the operands' dtype, and fully overwritten (K == 0 gives zeros).
#pragma once

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

inline constinit KernelTable<void(const Tensor& a, const Tensor& b, Tensor& out)> matmul_kernel{
    "matmul"};

}  // namespace mt::runtime
