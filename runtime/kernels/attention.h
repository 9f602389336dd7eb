// Kernel tables of the attention family (the op is in runtime/ops/attention.h).
// Operands are contiguous and all f32 or all f64 (the op upcasts 16-bit inputs):
// q [B, Hq, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv], out and dout [B, Hq, T, Dv],
// lse [B, Hq, T] (the logsumexp of each row's scaled scores; -inf for a row with no visible key).
#pragma once

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// Writes out and lse.
inline constinit KernelTable<void(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                  double scale, Tensor& out, Tensor& lse)>
    attention_forward_kernel{"scaled_dot_product_attention"};

// Writes dq (like q) and dk, dv (like k, v) from the saved out and lse; an undefined dq, or
// undefined dk and dv, is not computed (dk and dv come together). Deterministic.
inline constinit KernelTable<void(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  bool causal, double scale, Tensor& dq, Tensor& dk, Tensor& dv)>
    attention_backward_kernel{"scaled_dot_product_attention_backward"};

}  // namespace mt::runtime
