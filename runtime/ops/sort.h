// Sorting along a dim: sort, argsort and topk (torch semantics, results are {values, indices}
// with i64 indices; see ValuesIndices in runtime/ops/reduce.h). Always stable: equal values keep
// their original order (lower index first) whether ascending or descending. NaN counts as larger
// than every number (as in torch): last when ascending, first when descending or largest.
#pragma once

#include "runtime/ops/reduce.h"

namespace mt::runtime {

// Values sorted along `dim` and their positions in x. `stable` is accepted for torch parity; the
// sort is stable either way. Values are differentiable (backward: scatter into zeros).
ValuesIndices sort(const Tensor& x, int64_t dim = -1, bool descending = false, bool stable = true);
// The indices of sort(x, dim, descending).
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);

// The k largest (or smallest) elements along `dim`, 0 <= k <= x.size(dim). Results are always
// sorted (largest first, or smallest first when !largest), ties broken by lower index, so
// `sorted = false` gives the same answer. Values are differentiable (backward: scatter into zeros).
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                   bool sorted = true);

}  // namespace mt::runtime
