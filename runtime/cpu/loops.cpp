#include "runtime/cpu/loops.h"

#include "runtime/core/error.h"

namespace mt::runtime::cpu {

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

}  // namespace mt::runtime::cpu
