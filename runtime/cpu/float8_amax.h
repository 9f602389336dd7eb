// The CPU's float8 amax (max |value| as the largest |bits|, a NaN winning) into an f32 [1]
// tensor: the float8_amax kernel's body, for CPU kernels that measure what they wrote
// (runtime/ops/float8_amax_notes.h) without a dispatch of their own.
#pragma once

#include "runtime/core/tensor.h"

namespace mt::runtime::cpu {

// x contiguous, f32, bf16 or f64.
void float8_amax_into(const Tensor& x, Tensor& amax);

}  // namespace mt::runtime::cpu
