// Kernel tables of the swiglu family (the op is in runtime/ops/swiglu.h). Contiguous operands of
// one shape and dtype.
#pragma once

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// out = silu(gate) * up. A defined amax output (f32 [1], zeroed; the outputs f32 or bf16) is
// raised to max |output| as stored (runtime/ops/float8_amax_notes.h), here and below.
inline constinit KernelTable<void(const Tensor& gate, const Tensor& up, Tensor& out,
                                  Tensor& out_amax)>
    swiglu_forward_kernel{"swiglu"};

// dgate = dy * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate))), dup = dy * silu(gate);
// an undefined dgate or dup is not computed (nor its amax).
inline constinit KernelTable<void(const Tensor& dy, const Tensor& gate, const Tensor& up,
                                  Tensor& dgate, Tensor& dup, Tensor& dgate_amax,
                                  Tensor& dup_amax)>
    swiglu_backward_kernel{"swiglu_backward"};

}  // namespace mt::runtime
