// SwiGLU gating of the Llama feed-forward block: swiglu(gate, up) = silu(gate) * up, with
// silu(g) = g * sigmoid(g), as one fused pass (and a fused backward) instead of three ops.
// gate and up must have the same shape and floating dtype (no broadcasting).
#pragma once

#include "runtime/core/tensor.h"

namespace mt::runtime {

// Differentiable w.r.t. gate and up; 16-bit inputs compute in f32.
Tensor swiglu(const Tensor& gate, const Tensor& up);

}  // namespace mt::runtime
