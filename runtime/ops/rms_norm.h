// RMSNorm (Llama): y = x * rsqrt(mean(x^2, last dim) + eps) * weight, as one fused kernel that
// saves only rstd per row for backward; the backward kernel computes dx and dweight together.
// 16-bit inputs compute in f32 and round once on store; dweight is summed deterministically.
#pragma once

#include "runtime/core/tensor.h"

namespace mt::runtime {

// x [..., D], weight [D] of x's dtype (floating), eps >= 0. Differentiable w.r.t. x and weight.
// Unlike Meta's reference (which rounds x * rstd to x's dtype before multiplying by weight),
// the product is rounded once.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

}  // namespace mt::runtime
