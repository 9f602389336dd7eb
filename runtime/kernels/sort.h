// Kernel table of the sort family (sort, argsort, topk; the ops are in runtime/ops/sort.h).
#pragma once

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// x contiguous; values (x's dtype) and indices (i64) contiguous, x's shape with size k at `dim`.
// Writes, for every line of x along `dim`, its first k elements in sorted order (ascending, or
// descending when `descending`) and their positions. The order is total and stable: NaN sorts as
// larger than every number (all NaNs equal), and equal values keep their original order (lower
// index first) in both directions. k == x.size(dim) is a full sort; k < size is topk.
inline constinit KernelTable<void(const Tensor& x, int64_t dim, int64_t k, bool descending,
                                  Tensor& values, Tensor& indices)>
    sort_kernel{"sort"};

}  // namespace mt::runtime
