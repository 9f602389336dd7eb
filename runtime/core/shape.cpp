#include "runtime/core/shape.h"

#include "runtime/core/error.h"

namespace mt::runtime {

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape unravel_index(int64_t flat, const Shape& shape) {
  Shape pos(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    pos[i] = shape[i] > 0 ? flat % shape[i] : 0;
    flat = shape[i] > 0 ? flat / shape[i] : flat;
  }
  return pos;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i] > 0 ? shape[i] : 1;
  }
  return strides;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  MT_CHECK(dim >= lo && dim <= hi, op, ": dim ", dim, " out of range for a ", ndim,
           "-D tensor (expected ", lo, "..", hi, ")");
  return dim < 0 ? dim + (ndim == 0 ? 1 : ndim) : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MT_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
             " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::ostream& operator<<(std::ostream& os, const Shape& shape) {
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  return os << "]";
}

Shape broadcast_strides(const Shape& t_shape, const Shape& t_strides, const Shape& shape) {
  MT_CHECK(t_shape.size() <= shape.size(), "broadcast_strides: ", t_shape, " to ", shape);
  Shape out(shape.size(), 0);
  const size_t lead = shape.size() - t_shape.size();
  for (size_t i = 0; i < t_shape.size(); ++i) {
    MT_CHECK(t_shape[i] == shape[lead + i] || t_shape[i] == 1, "cannot broadcast ", t_shape,
             " to ", shape);
    out[lead + i] = t_shape[i] == 1 ? 0 : t_strides[i];
  }
  return out;
}

}  // namespace mt::runtime
