// Reductions over dims (keepdim optional) and over everything. Sums of floating tensors accumulate
// in f64 in a fixed order, so results do not depend on the thread count; sums of integer and bool
// tensors are i64 (and not differentiable). An empty `dims` list means every dim (as in PyTorch).
#pragma once

#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime {

Tensor sum(const Tensor& x);  // 0-D
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor max(const Tensor& x);  // 0-D; differentiable (gradient to the first maximum)
struct ValuesIndices {
  Tensor values;
  Tensor indices;  // i64
};
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // i64, first maximum

// Sums `x` down to `shape` (the reverse of broadcasting): the backward of broadcasting ops.
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace mt::runtime
