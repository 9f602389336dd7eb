// Kernel tables of the softmax family (the ops are runtime/ops/softmax.h).
//
// softmax_forward_kernel(device, x, dim, log, out): softmax (log_softmax when `log`) of the
//   contiguous tensor x along dim (already wrapped, 0 <= dim < x.dim()) into contiguous out.
// softmax_backward_kernel(device, out, grad, dim, log, grad_input): from the forward output and
//   the output gradient (both contiguous, out's shape and dtype):
//     softmax:      grad_input = out * (grad - sum(grad * out, dim))
//     log_softmax:  grad_input = grad - exp(out) * sum(grad, dim)
// 16-bit dtypes are computed in f32. Each row is reduced in a fixed order by one thread.
#pragma once

#include <cstdint>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

inline constinit KernelTable<void(const Tensor& x, int64_t dim, bool log, Tensor& out)>
    softmax_forward_kernel{"softmax"};
inline constinit KernelTable<void(const Tensor& out, const Tensor& grad, int64_t dim, bool log,
                                  Tensor& grad_input)>
    softmax_backward_kernel{"softmax_backward"};

}  // namespace mt::runtime
