// Kernel tables of the loss family (the ops are runtime/ops/loss.h).
//
// cross_entropy_forward_kernel(device, logits, targets, ignore_index, bad_target, losses, lse):
//   logits [N, V] contiguous (any floating dtype), targets [N] contiguous i64 or i32; losses and
//   lse are [N] contiguous in the accumulation dtype (f32, or f64 for f64 logits). Writes
//   lse[i] = logsumexp(logits[i]) and losses[i] = lse[i] - logits[i, t_i], both 0 where
//   t_i == ignore_index. The first target outside [0, V) that is not ignore_index is reported
//   with bad_target(position, value): the CPU throws before writing anything; a device reports
//   it when the host next waits for it (runtime/core/deferred_errors.h) and skips that row.
// cross_entropy_backward_kernel(device, logits, targets, lse, grad, ignore_index, grad_logits,
//                               grad_amax):
//   grad_logits[i, j] = (exp(logits[i, j] - lse[i]) - (j == t_i)) * grad_i, and 0 on
//   ignored rows; grad is [N] or a single element (used for every row), in the accumulation dtype.
//   A defined grad_amax (f32 [1], zeroed; grad_logits f32 or bf16) is raised to max
//   |grad_logits| as stored: a float8 output projection's gradient (ops/float8_amax_notes.h).
#pragma once

#include <cstdint>

#include "runtime/core/deferred_errors.h"
#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

inline constinit KernelTable<void(const Tensor& logits, const Tensor& targets,
                                  int64_t ignore_index, const BadElementMessage& bad_target,
                                  Tensor& losses, Tensor& lse)>
    cross_entropy_forward_kernel{"cross_entropy"};
inline constinit KernelTable<void(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  const Tensor& grad, int64_t ignore_index, Tensor& grad_logits,
                                  Tensor& grad_amax)>
    cross_entropy_backward_kernel{"cross_entropy_backward"};

}  // namespace mt::runtime
