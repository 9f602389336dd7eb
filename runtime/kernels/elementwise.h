// Kernel tables of the elementwise family (runtime/ops/elementwise.h). Backends register their
// implementations (runtime/cpu/elementwise.cpp).
//
// Conventions shared by every kernel here:
// - `out` is allocated by the caller with the broadcast shape; inputs have any strides and are
//   broadcast to out.shape() (stride 0 along broadcast dims), so no input is copied.
// - `out` may be one of the inputs (in-place ops) provided it has exactly that input's geometry.
// - Inputs share one dtype; out has it too, except comparisons and logical ops (bool).
// - 16-bit floats are computed in f32 and rounded on store.
// - Integer division by zero throws (after the loop; nothing is undefined).
#pragma once

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/elementwise.h"

namespace mt::runtime {

// out = op(x)
inline constinit KernelTable<void(UnaryOp op, const Tensor& x, const Tensor& out)> unary_kernel{
    "unary"};
// out = op(a, b)
inline constinit KernelTable<void(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out)>
    binary_kernel{"binary"};
// out = op(a, scalar); the scalar is converted to a's compute type (f32 for 16-bit floats).
inline constinit KernelTable<void(BinaryOp op, const Tensor& a, double scalar, const Tensor& out)>
    binary_scalar_kernel{"binary_scalar"};
// out = a + alpha * b (add_ with alpha)
inline constinit KernelTable<void(const Tensor& a, const Tensor& b, double alpha,
                                  const Tensor& out)>
    add_scaled_kernel{"add_scaled"};
// out = cond ? a : b; cond is bool.
inline constinit KernelTable<void(const Tensor& cond, const Tensor& a, const Tensor& b,
                                  const Tensor& out)>
    where_kernel{"where"};
// out = min(max(x, lo), hi), NaN stays NaN; missing bounds are passed as -inf / +inf.
inline constinit KernelTable<void(const Tensor& x, double lo, double hi, const Tensor& out)>
    clamp_kernel{"clamp"};

}  // namespace mt::runtime
