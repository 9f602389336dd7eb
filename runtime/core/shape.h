// Shapes and strides (in elements, not bytes) and the helpers ops use to validate them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <vector>

namespace mt::runtime {

using Shape = std::vector<int64_t>;

int64_t numel_of(const Shape& shape);
// Strides of a tensor [t_shape, t_strides] broadcast to `shape` (0 where t's dim is 1 or
// missing); throws when it does not broadcast.
Shape broadcast_strides(const Shape& t_shape, const Shape& t_strides, const Shape& shape);
Shape contiguous_strides(const Shape& shape);
// The multi-dimensional position of element `flat` of a row-major `shape` (for messages).
Shape unravel_index(int64_t flat, const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// The broadcast of two shapes (numpy rules); throws naming `op` and both shapes when they clash.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

std::ostream& operator<<(std::ostream& os, const Shape& shape);  // prints [2, 3]

}  // namespace mt::runtime
