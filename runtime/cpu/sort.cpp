// CPU kernel of the sort family: OpenMP over the lines along `dim`; each line is copied out,
// ordered with a strict total order (value, then position) and written back, so the result is
// stable and independent of the thread count and of the sorting algorithm.
#include "runtime/kernels/sort.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "runtime/cpu/loops.h"

namespace mt::runtime::cpu {
namespace {

// a < b with NaN above every number (NaNs compare equal to each other).
template <class C>
inline bool less_nan_last(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
  }
  return a < b;
}

template <class T, bool kDescending>
void sort_impl(const Tensor& x, int64_t dim, int64_t k, Tensor& values, Tensor& indices) {
  using C = compute_t<T>;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < dim) outer *= x.size(d);
    if (d > dim) inner *= x.size(d);
  }
  const int64_t n = x.size(dim);
  if (k == 0 || outer * inner == 0) return;
  const T* xp = x.data<T>();
  T* vp = values.data<T>();
  int64_t* ip = indices.data<int64_t>();
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / n);
  parallel_for(outer * inner, grain, [&](int64_t begin, int64_t end) {
    std::vector<C> v(static_cast<size_t>(n));
    std::vector<int64_t> order(static_cast<size_t>(n));
    const auto before = [&](int64_t a, int64_t b) {
      const C va = v[size_t(a)], vb = v[size_t(b)];
      if (kDescending ? less_nan_last(vb, va) : less_nan_last(va, vb)) return true;
      if (kDescending ? less_nan_last(va, vb) : less_nan_last(vb, va)) return false;
      return a < b;  // equal values: original order (stable)
    };
    for (int64_t r = begin; r < end; ++r) {
      const int64_t o = r / inner, j = r % inner;
      const T* line = xp + o * n * inner + j;
      for (int64_t i = 0; i < n; ++i) {
        v[size_t(i)] = C(line[i * inner]);
        order[size_t(i)] = i;
      }
      if (k < n) {
        std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
      } else {
        std::sort(order.begin(), order.end(), before);
      }
      T* vout = vp + o * k * inner + j;
      int64_t* iout = ip + o * k * inner + j;
      for (int64_t i = 0; i < k; ++i) {
        vout[i * inner] = line[order[size_t(i)] * inner];
        iout[i * inner] = order[size_t(i)];
      }
    }
  });
}

void sort(const Tensor& x, int64_t dim, int64_t k, bool descending, Tensor& values,
          Tensor& indices) {
  dispatch_dtype(x.dtype(), "sort", [&](auto tv) {
    using T = decltype(tv);
    if (descending) {
      sort_impl<T, true>(x, dim, k, values, indices);
    } else {
      sort_impl<T, false>(x, dim, k, values, indices);
    }
  });
}

}  // namespace

MT_REGISTER_KERNEL(sort_kernel, DeviceType::CPU, sort);

}  // namespace mt::runtime::cpu
