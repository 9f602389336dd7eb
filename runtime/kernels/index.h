// Kernel tables of the index family (the ops are in runtime/ops/index.h).
// Index tensors are contiguous, i64 or i32, and already checked to lie in [0, size) by
// index_bounds_kernel (except where a kernel says otherwise). "self" tensors are modified in place.
#pragma once

#include "runtime/core/deferred_errors.h"
#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// Reports the first element of `index` (contiguous, i64/i32) outside [0, size) with
// message(position, value): the CPU throws at once, a device reports it when the host next waits
// for it (runtime/core/deferred_errors.h). So device kernels that take a checked index must skip
// out-of-range elements rather than touch memory outside their tensors.
inline constinit KernelTable<void(const Tensor& index, int64_t size,
                                  const BadElementMessage& message)>
    index_bounds_kernel{"index_bounds"};

// x contiguous, index 1-D; out (contiguous, x's shape with size index.numel() at dim):
// out[..., i, ...] = x[..., index[i], ...].
inline constinit KernelTable<void(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out)>
    index_select_kernel{"index_select"};

// self and source contiguous, index 1-D: self[..., index[i], ...] += alpha * source[..., i, ...].
// Repeated indices add in index order, whatever the thread count.
inline constinit KernelTable<void(Tensor& self, int64_t dim, const Tensor& index,
                                  const Tensor& source, double alpha)>
    index_add_kernel{"index_add"};

// self and source contiguous, index 1-D: self[..., index[i], ...] = source[..., i, ...]; of
// repeated indices the last one's slice is written.
inline constinit KernelTable<void(Tensor& self, int64_t dim, const Tensor& index,
                                  const Tensor& source)>
    index_copy_kernel{"index_copy"};

// x any strides, index of x's ndim (contiguous), out contiguous of index's shape:
// out[p] = x[p with p[dim] = index[p]].
inline constinit KernelTable<void(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out)>
    gather_kernel{"gather"};

// self contiguous, index contiguous, src any strides (at least index's extent in every dim):
// self[p with p[dim] = index[p]] = src[p] (or += when accumulate). Positions that hit the same
// element of self are applied in index order along `dim`, whatever the thread count.
inline constinit KernelTable<void(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                                  bool accumulate)>
    scatter_kernel{"scatter"};

}  // namespace mt::runtime
