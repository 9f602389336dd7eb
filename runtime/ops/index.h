// Indexing ops with torch semantics: index_select, index_add(_), index_copy_, gather, scatter,
// scatter_add.
// Indices are i64 (i32 accepted) and must lie in [0, size): anything else throws an mt::Error
// naming the op, the index value, its position, the dim and its size (no negative wrap-around).
// Accumulating ops are deterministic: repeated indices add up in index order, whatever the thread
// count. Values may be any dtype for the copying ops; the adding ops reject bool.
#pragma once

#include "runtime/core/tensor.h"

namespace mt::runtime {

// Rows of x along `dim` picked by `index` (1-D, repeats allowed): out.size(dim) = index.numel().
// Differentiable w.r.t. x (backward: index_add into zeros).
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);

// x with alpha * source[..., i, ...] added to x[..., index[i], ...]; source is x's shape with
// size index.numel() at `dim`. Differentiable w.r.t. x and source.
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source,
                 double alpha = 1.0);
// In place on `self` (any layout); not recorded by autograd (throws if `self` requires grad while
// grad mode is on). For integer dtypes alpha must be a whole number.
const Tensor& index_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                         double alpha = 1.0);

// self[..., index[i], ...] = source[..., i, ...] along `dim`, in place (any layout; source any
// strides, x's shape with size index.numel() at `dim`); with repeated indices the last one wins.
// Not recorded by autograd (throws if `self` requires grad while grad mode is on).
const Tensor& index_copy_(const Tensor& self, int64_t dim, const Tensor& index,
                          const Tensor& source);

// out[p] = x[p with p[dim] = index[p]]; index has x's ndim and index.size(d) <= x.size(d) for
// d != dim; out has index's shape. Differentiable w.r.t. x (backward: scatter_add into zeros).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

// A copy of x with out[p with p[dim] = index[p]] = src[p] for every position p of index.
// index, src and x have the same ndim; index.size(d) <= src.size(d) for all d and
// index.size(d) <= x.size(d) for d != dim (elements of src outside index's extent are unused).
// When several positions hit one element, the last one along `dim` wins (deterministic).
// Differentiable w.r.t. x (the gradient is zero where x was overwritten) and src (gather of the
// gradient; with repeated targets every src element gets it, as in torch).
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// As scatter, adding instead of replacing. Differentiable w.r.t. x and src.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

}  // namespace mt::runtime
