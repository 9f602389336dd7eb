// Kernel tables of the rms_norm family (the op is in runtime/ops/rms_norm.h).
// Inputs are contiguous; x is viewed as [rows, D] with D = weight.size(0). Statistics (rstd) are
// f32, or f64 when x is f64.
#pragma once

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// Writes y (like x) and rstd [rows] = 1 / sqrt(mean(x^2) + eps); a defined y_amax (f32 [1],
// zeroed; y f32 or bf16) is raised to max |y| as stored (runtime/ops/float8_amax_notes.h).
inline constinit KernelTable<void(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                                  Tensor& rstd, Tensor& y_amax)>
    rms_norm_forward_kernel{"rms_norm"};

// From dy, x, weight and the saved rstd, writes dx (like x) and dweight (like weight); an
// undefined dx or dweight is not computed. dweight is summed over rows in a fixed order.
inline constinit KernelTable<void(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                  const Tensor& rstd, Tensor& dx, Tensor& dweight)>
    rms_norm_backward_kernel{"rms_norm_backward"};

}  // namespace mt::runtime
