// Matrix products: matmul (2-D, batched with numpy-broadcast batch dims, 1-D vectors) and linear.
// Transpose flags select a^T / b^T on the last two dims without copying: transposed views are
// handed to BLAS as such. f32/f64 use OpenBLAS sgemm/dgemm; bf16/f16 accumulate in f32.
#pragma once

#include "runtime/core/tensor.h"

namespace mt::runtime {

// op(a) @ op(b) where op(t) = t, or t with its last two dims swapped when the flag is set.
// a: [..., M, K] ([..., K, M] with transpose_a), b: [..., K, N] ([..., N, K] with transpose_b);
// batch dims broadcast (numpy rules); result [batch..., M, N]. A 1-D operand is a vector (numpy
// semantics: a [K] acts as [1, K], b [K] as [K, 1], and that dim is removed from the result; the
// transpose flag of a 1-D operand is ignored). Both operands must share a floating dtype and a
// device. Differentiable in both operands; gradients of broadcast batch dims are summed.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

// x [..., in] @ weight[out, in]^T (+ bias [out]) -> [..., out]: the leading dims of x are
// flattened into one GEMM. `bias` may be undefined. Differentiable in x, weight and bias.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace mt::runtime
