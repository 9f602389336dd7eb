// Kernel tables of the embedding family (the op is runtime/ops/embedding.h).
//
// embedding_forward_kernel(device, weight, ids, out): weight [V, D] with unit column stride (any
//   row stride), ids [n] contiguous i32/i64 checked by index_bounds_kernel (kernels/index.h: a
//   device kernel skips an id outside [0, V), which that check reports), out [n, D] contiguous
//   of weight's dtype: out[i] = weight[ids[i]].
// embedding_backward_kernel(device, grad, ids, grad_weight): grad [n, D] contiguous, ids [n]
//   contiguous (checked as in the forward), grad_weight [V, D] contiguous and zero-filled by the
//   caller: grad_weight[v] += sum of grad[i] over ids[i] == v, summed in increasing i (in f32 for
//   16-bit dtypes), so the result is bitwise independent of the thread count.
#pragma once

#include <cstdint>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

inline constinit KernelTable<void(const Tensor& weight, const Tensor& ids, Tensor& out)>
    embedding_forward_kernel{"embedding"};
inline constinit KernelTable<void(const Tensor& grad, const Tensor& ids, Tensor& grad_weight)>
    embedding_backward_kernel{"embedding_backward"};

}  // namespace mt::runtime
