// Kernel tables of the loss family (the ops are runtime/ops/loss.h).
//
// cross_entropy_forward_kernel(device, logits, targets, ignore_index, losses, lse):
//   logits [N, V] contiguous (any floating dtype), targets [N] contiguous i64 or i32; losses and
//   lse are [N] contiguous in the accumulation dtype (f32, or f64 for f64 logits). Writes
//   lse[i] = logsumexp(logits[i]) and losses[i] = lse[i] - logits[i, t_i], both 0 where
//   t_i == ignore_index. First validates every target: on a target outside [0, V) that is not
//   ignore_index it writes nothing and returns {that position, -}; else {-1, count of
//   non-ignored targets}.
// cross_entropy_backward_kernel(device, logits, targets, lse, grad, scale, ignore_index,
//                               grad_logits):
//   grad_logits[i, j] = (exp(logits[i, j] - lse[i]) - (j == t_i)) * grad_i * scale, and 0 on
//   ignored rows; grad is [N] or a single element (used for every row), in the accumulation dtype.
#pragma once

#include <cstdint>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

struct CrossEntropyForwardStatus {
  int64_t bad_position = -1;  // first invalid target, or -1
  int64_t count = 0;          // targets that are not ignore_index
};

inline constinit KernelTable<CrossEntropyForwardStatus(
    const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& losses, Tensor& lse)>
    cross_entropy_forward_kernel{"cross_entropy"};
inline constinit KernelTable<void(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  const Tensor& grad, double scale, int64_t ignore_index,
                                  Tensor& grad_logits)>
    cross_entropy_backward_kernel{"cross_entropy_backward"};

}  // namespace mt::runtime
