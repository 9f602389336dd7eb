// Kernel tables of the embedding family (the op is runtime/ops/embedding.h).
//
// embedding_forward_kernel(device, weight, ids, out) -> int64_t: weight [V, D] with unit column
//   stride (any row stride), ids [n] contiguous i32/i64, out [n, D] contiguous of weight's dtype:
//   out[i] = weight[ids[i]]. First validates every id: returns the position of the first id
//   outside [0, V) (writing nothing), else -1.
// embedding_backward_kernel(device, grad, ids, grad_weight): grad [n, D] contiguous, ids [n]
//   contiguous (already validated), grad_weight [V, D] contiguous and zero-filled by the caller:
//   grad_weight[v] += sum of grad[i] over ids[i] == v, summed in increasing i (in f32 for 16-bit
//   dtypes), so the result is bitwise independent of the thread count.
#pragma once

#include <cstdint>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

inline constinit KernelTable<int64_t(const Tensor& weight, const Tensor& ids, Tensor& out)>
    embedding_forward_kernel{"embedding"};
inline constinit KernelTable<void(const Tensor& grad, const Tensor& ids, Tensor& grad_weight)>
    embedding_backward_kernel{"embedding_backward"};

}  // namespace mt::runtime
