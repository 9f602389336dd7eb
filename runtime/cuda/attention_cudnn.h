// cuDNN's fused flash attention (SDPA forward with stats and SDPA backward, through the cuDNN
// frontend graph API) for bf16/f16 operands, as runtime/cuda/attention.cu's fast path. Operands
// follow runtime/kernels/attention.h (views with stride 1 in the last dim, one 16-bit dtype,
// lse f32). Each call returns
// false, having written nothing, when cuDNN cannot run the configuration (a build without the
// cuDNN frontend, a causal T > S, a head dim cuDNN does not take, ...); the reason is printed on
// stderr once. The caller then runs its own kernel.
#pragma once

#include "runtime/core/tensor.h"

namespace mt::runtime::cuda {

bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                             double scale, Tensor& out, Tensor& lse);

// dq, or dk and dv, may be undefined (not wanted).
bool cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, bool causal, double scale,
                              Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace mt::runtime::cuda
