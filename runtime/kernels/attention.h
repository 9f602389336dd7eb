// Kernel tables of the attention family (the op is in runtime/ops/attention.h).
// Operands are contiguous (on a device whose backend registers attention_takes_views_kernel
// (CPU and CUDA), q, k, v, out, dout, dq, dk and dv may be any views with stride 1 in their last
// dim; lse stays contiguous), q, k, v, out, dout, dq, dk and dv of one dtype:
// q [B, Hq, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv], out and dout [B, Hq, T, Dv],
// lse [B, Hq, T] (the logsumexp of each row's scaled scores; -inf for a row with no visible key).
// The dtype is f32 or f64 (lse alike), or a 16-bit dtype for which the backend's
// attention_takes_16bit_kernel returns true (CUDA: bf16 and f16; CPU: bf16 where oneDNN runs bf16
// GEMMs), with an f32 lse; otherwise the op upcasts 16-bit inputs to f32.
#pragma once

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// Writes out and lse.
inline constinit KernelTable<void(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                  double scale, Tensor& out, Tensor& lse)>
    attention_forward_kernel{"scaled_dot_product_attention"};

// Writes dq (like q) and dk, dv (like k, v) from the saved out and lse; an undefined dq, or
// undefined dk and dv, is not computed (dk and dv come together). Deterministic while
// deterministic_algorithms() (runtime/core/determinism.h); else a backend may run a faster kernel
// whose last bits vary between runs (CUDA: cuDNN's non-deterministic backward).
inline constinit KernelTable<void(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  bool causal, double scale, Tensor& dq, Tensor& dk, Tensor& dv)>
    attention_backward_kernel{"scaled_dot_product_attention_backward"};

// Registered by a backend whose kernels take some 16-bit operand dtypes natively: whether they take
// `dtype` (see above); the op asks it instead of knowing about devices.
inline constinit KernelTable<bool(DType dtype)> attention_takes_16bit_kernel{
    "attention_takes_16bit"};

// Registered, returning true, by a backend whose kernels take views (see above), so the op can
// pass transposed [B, T, H, D] activations without copies and lay its outputs out that way.
inline constinit KernelTable<bool()> attention_takes_views_kernel{"attention_takes_views"};

}  // namespace mt::runtime
