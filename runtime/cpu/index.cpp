// CPU kernels of the index family. Accumulating kernels parallelise only over positions that can
// never touch the same output element, and walk the index in order within each, so repeated
// indices add up in index order whatever the thread count.
#include "runtime/kernels/index.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <type_traits>

#include "runtime/cpu/loops.h"

namespace mt::runtime::cpu {
namespace {

// Calls fn(I{}) with I the C++ type of an index tensor (i64 or i32).
template <class Fn>
decltype(auto) dispatch_index(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::I64:
      return fn(int64_t{});
    case DType::I32:
      return fn(int32_t{});
    default:
      break;
  }
  MT_FAIL(op, ": expected an i64 or i32 index, got ", dtype_name(t));
}

// Sizes of a contiguous shape seen as [outer, shape[dim], inner].
struct DimSplit {
  int64_t outer = 1, size = 1, inner = 1;
};
DimSplit split_at(const Shape& shape, int64_t dim) {
  DimSplit s;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d) {
    if (d < dim) s.outer *= shape[d];
    if (d > dim) s.inner *= shape[d];
  }
  s.size = shape.empty() ? 1 : shape[dim];
  return s;
}

// self += alpha * src for one element, computed in compute_t<T>.
template <class T>
inline void accumulate(T& self, T src, compute_t<T> alpha) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, bool>) {
    self = self || src;
  } else {
    self = T(C(self) + alpha * C(src));
  }
}

void index_bounds(const Tensor& index, int64_t size, const BadElementMessage& message) {
  dispatch_index(index.dtype(), "index_bounds", [&](auto iv) {
    using I = decltype(iv);
    const I* ip = index.data<I>();
    constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
    std::atomic<int64_t> first{kNone};
    parallel_for(index.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (ip[i] < 0 || int64_t(ip[i]) >= size) {
          int64_t cur = first.load();
          while (i < cur && !first.compare_exchange_weak(cur, i)) {
          }
          return;
        }
      }
    });
    const int64_t pos = first.load();
    if (pos != kNone) MT_FAIL(message(pos, int64_t(ip[pos])));
  });
}

// A pure copy of rows: works on bytes, so one instantiation serves every dtype.
void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  dispatch_index(index.dtype(), "index_select", [&](auto iv) {
    using I = decltype(iv);
    const DimSplit s = split_at(x.shape(), dim);
    const int64_t n = index.numel();
    const size_t row_bytes = size_t(s.inner) * x.element_size();
    const char* xp = static_cast<const char*>(x.data_ptr());
    char* op = static_cast<char*>(out.data_ptr());
    const I* ip = index.data<I>();
    const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(s.inner, 1));
    parallel_for(s.outer * n, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t o = r / n, i = r % n;
        std::memcpy(op + size_t(r) * row_bytes,
                    xp + size_t(o * s.size + int64_t(ip[i])) * row_bytes, row_bytes);
      }
    });
  });
}

// Work items are (outer row, block of kBlock inner elements); each walks the whole index in
// order, so no two threads touch the same element and repeated indices add in index order.
template <class T, class I>
void index_add_impl(Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                    double alpha) {
  constexpr int64_t kBlock = 512;
  using C = compute_t<T>;
  const DimSplit s = split_at(self.shape(), dim);
  const int64_t n = index.numel();
  if (n == 0 || s.inner == 0 || s.outer == 0) return;
  T* sp = self.data<T>();
  const T* src = source.data<T>();
  const I* ip = index.data<I>();
  const C a = C(alpha);
  const int64_t block = std::min(s.inner, kBlock);
  const int64_t nblocks = (s.inner + block - 1) / block;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / (n * block));
  parallel_for(s.outer * nblocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / nblocks;
      const int64_t jb = (t % nblocks) * block, je = std::min(s.inner, jb + block);
      for (int64_t i = 0; i < n; ++i) {
        T* dst = sp + (o * s.size + int64_t(ip[i])) * s.inner;
        const T* from = src + (o * n + i) * s.inner;
        for (int64_t j = jb; j < je; ++j) accumulate(dst[j], from[j], a);
      }
    }
  });
}

void index_add(Tensor& self, int64_t dim, const Tensor& index, const Tensor& source, double alpha) {
  dispatch_dtype(self.dtype(), "index_add", [&](auto tv) {
    dispatch_index(index.dtype(), "index_add", [&](auto iv) {
      index_add_impl<decltype(tv), decltype(iv)>(self, dim, index, source, alpha);
    });
  });
}

// Rows in index order, so the last of repeated indices is the one left; parallel over outer.
void index_copy(Tensor& self, int64_t dim, const Tensor& index, const Tensor& source) {
  dispatch_index(index.dtype(), "index_copy", [&](auto iv) {
    using I = decltype(iv);
    const DimSplit s = split_at(self.shape(), dim);
    const int64_t n = index.numel();
    const size_t row_bytes = size_t(s.inner) * self.element_size();
    char* sp = static_cast<char*>(self.data_ptr());
    const char* src = static_cast<const char*>(source.data_ptr());
    const I* ip = index.data<I>();
    const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n * s.inner, 1));
    parallel_for(s.outer, grain, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o)
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(sp + size_t(o * s.size + int64_t(ip[i])) * row_bytes,
                      src + size_t(o * n + i) * row_bytes, row_bytes);
    });
  });
}

template <class T, class I>
void gather_impl(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  Shape xs = x.strides();
  const int64_t x_dim_stride = xs[size_t(dim)];
  xs[size_t(dim)] = 0;  // the index supplies the position along dim
  const T* xp = x.data<T>();
  const I* ip = index.data<I>();
  T* op = out.data<T>();
  strided_loop<3>(
      index.shape(), {out.strides(), index.strides(), xs},
      [&](const std::array<int64_t, 3>& off, int64_t count, const std::array<int64_t, 3>& st) {
        for (int64_t j = 0; j < count; ++j) {
          op[off[0] + j * st[0]] =
              xp[off[2] + j * st[2] + int64_t(ip[off[1] + j * st[1]]) * x_dim_stride];
        }
      });
}

void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  dispatch_dtype(x.dtype(), "gather", [&](auto tv) {
    dispatch_index(index.dtype(), "gather",
                   [&](auto iv) { gather_impl<decltype(tv), decltype(iv)>(x, dim, index, out); });
  });
}

// Moves entry `dim` of v to the end.
Shape dim_last(Shape v, int64_t dim) {
  std::rotate(v.begin() + dim, v.begin() + dim + 1, v.end());
  return v;
}

// The loop runs over index positions with `dim` moved innermost. strided_loop hands each run of
// the (coalesced) innermost dim to one thread and the innermost run always spans the whole of
// `dim`, so positions that differ only along `dim` (the only ones that can hit the same element
// of self) are applied by one thread, in increasing order along `dim`.
template <class T, class I>
void scatter_impl(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                  bool accumulate_values) {
  Shape ss = self.strides();
  const int64_t self_dim_stride = ss[size_t(dim)];
  ss[size_t(dim)] = 0;  // the index supplies the position along dim
  T* sp = self.data<T>();
  const I* ip = index.data<I>();
  const T* rp = src.data<T>();
  const compute_t<T> one = compute_t<T>(1);
  strided_loop<3>(
      dim_last(index.shape(), dim),
      {dim_last(ss, dim), dim_last(index.strides(), dim), dim_last(src.strides(), dim)},
      [&](const std::array<int64_t, 3>& off, int64_t count, const std::array<int64_t, 3>& st) {
        for (int64_t j = 0; j < count; ++j) {
          T& d = sp[off[0] + j * st[0] + int64_t(ip[off[1] + j * st[1]]) * self_dim_stride];
          const T v = rp[off[2] + j * st[2]];
          if (accumulate_values) {
            accumulate(d, v, one);
          } else {
            d = v;
          }
        }
      });
}

void scatter(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  dispatch_dtype(self.dtype(), "scatter", [&](auto tv) {
    dispatch_index(index.dtype(), "scatter", [&](auto iv) {
      scatter_impl<decltype(tv), decltype(iv)>(self, dim, index, src, accumulate);
    });
  });
}

}  // namespace

MT_REGISTER_KERNEL(index_bounds_kernel, DeviceType::CPU, index_bounds);
MT_REGISTER_KERNEL(index_select_kernel, DeviceType::CPU, index_select);
MT_REGISTER_KERNEL(index_add_kernel, DeviceType::CPU, index_add);
MT_REGISTER_KERNEL(index_copy_kernel, DeviceType::CPU, index_copy);
MT_REGISTER_KERNEL(gather_kernel, DeviceType::CPU, gather);
MT_REGISTER_KERNEL(scatter_kernel, DeviceType::CPU, scatter);

}  // namespace mt::runtime::cpu
