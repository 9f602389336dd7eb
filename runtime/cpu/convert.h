// Value conversion between element types for CPU kernels: float -> int saturates (NaN -> 0)
// instead of undefined behaviour; anything -> bool is `!= 0`.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/core/dtype.h"

namespace mt::runtime::cpu {

template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else {
    using C = compute_t<From>;
    const C c = C(v);
    if constexpr (std::is_same_v<To, bool>) {
      return c != C(0);
    } else if constexpr (std::is_integral_v<To> && !std::is_integral_v<C>) {
      if (!(c == c)) return To(0);
      constexpr double lo = double(std::numeric_limits<To>::min());
      constexpr double hi = double(std::numeric_limits<To>::max());
      const double d = double(c);
      if (d <= lo) return std::numeric_limits<To>::min();
      if (d >= hi) return std::numeric_limits<To>::max();
      return To(d);
    } else if constexpr (std::is_same_v<To, bfloat16> || std::is_same_v<To, float16>) {
      return To(float(c));
    } else {
      return To(c);
    }
  }
}

}  // namespace mt::runtime::cpu
