// Helpers for row-sparse table gradients (RowSparseGrad, runtime/ops/embedding_bag.h) kept by
// collections in GradientMode::RowSparse: merging the gradients of several backward passes
// (gradient accumulation), their contribution to a global gradient norm, and in-place scaling
// for clipping. They plug into runtime/optim/clip_grad.h's split:
//   partial = local_norm_pow(dense params) + row_sparse_norm_pow(sparse grads)
//   total = norm_from_pow(all-reduced partial); coef = clip_grads_with_norm_(dense, max, total);
//   scale_(sparse grads, coef)
// (rows absent from a RowSparseGrad are zero, so the norm over its rows is the table's norm).
// CPU tensors; f32 and f64 (16-bit gradients are summed in f32).
#pragma once

#include <vector>

#include "runtime/ops/embedding_bag.h"

namespace mt::runtime::sparse {

// a + b for the same table: the union of rows (sorted), rows present in both summed (a's + b's).
RowSparseGrad merge(const RowSparseGrad& a, const RowSparseGrad& b);
// Adds `more` into `acc` (matching by table; acc stays sorted by table).
void accumulate(std::vector<RowSparseGrad>& acc, const std::vector<RowSparseGrad>& more);
// sum |g|^p over every value (max |g| for p = +inf), in f64.
double row_sparse_norm_pow(const std::vector<RowSparseGrad>& grads, double norm_type = 2.0);
// Multiplies every value in place by `coef`.
void scale_(std::vector<RowSparseGrad>& grads, double coef);

}  // namespace mt::runtime::sparse
