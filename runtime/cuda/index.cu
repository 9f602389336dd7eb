// CUDA kernels of the index family (runtime/kernels/index.h). Copies (index_select, index_copy,
// gather, the non-accumulating scatter) move elements by size, one instantiation per element
// width. The
// accumulating kernels follow the CPU's schedule so they stay deterministic without atomics:
// index_add gives each thread one (outer, inner) position and walks the index in order (a long
// index is sorted by target first, and each run of equal targets walked in order); scatter
// gives each thread one index position off `dim` and walks `dim` in order. Repeated targets thus
// add in index order, with the CPU's per-step rounding (the results equal the CPU's bitwise).
#include <limits>

#include "runtime/cuda/deferred_verdict.cuh"
#include "runtime/cuda/index.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/sorted_positions.cuh"
#include "runtime/kernels/index.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::cuda {
namespace {

// Sizes of a contiguous shape seen as [outer, shape[dim], inner].
struct DimSplit {
  int64_t outer = 1, size = 1, inner = 1;
};
DimSplit split_at(const Shape& shape, int64_t dim) {
  DimSplit s;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d) {
    if (d < dim) s.outer *= shape[size_t(d)];
    if (d > dim) s.inner *= shape[size_t(d)];
  }
  s.size = shape.empty() ? 1 : shape[size_t(dim)];
  return s;
}

// alpha * v rounded on its own: nvcc would otherwise fuse `self + alpha * v` into one FMA (one
// rounding), while the CPU build rounds the product and the sum apart.
template <class C>
__device__ inline C mul_rn(C alpha, C v) {
  if constexpr (std::is_same_v<C, float>)
    return __fmul_rn(alpha, v);
  else if constexpr (std::is_same_v<C, double>)
    return __dmul_rn(alpha, v);
  else
    return C(alpha * v);
}

// self += alpha * src for one element in acc_t<T> (bool: or), rounded to T (the CPU's
// `accumulate`, with its roundings).
template <class T>
__device__ inline void accumulate(T& self, T src, acc_t<T> alpha) {
  using C = acc_t<T>;
  if constexpr (std::is_same_v<T, bool>) {
    self = self || src;
  } else {
    self = convert<T>(C(C(self) + mul_rn(alpha, C(src))));
  }
}

// Queues the verdict (deferred_verdict.cuh): the host does not wait for it.
void index_bounds(const Tensor& index, int64_t size, const BadElementMessage& message) {
  check_on_current_device(index, "index_bounds");
  const int64_t n = index.numel();
  if (n == 0) return;
  const Tensor verdict = new_verdict();
  unsigned long long* vp = ptr<unsigned long long>(verdict);
  MT_CUDA_DISPATCH_INDEX(index.dtype(), "index_bounds", I, [&] {
    const I* ip = ptr<I>(index);
    launch_linear(n, [=] __device__(int64_t i) {
      if (ip[i] < 0 || int64_t(ip[i]) >= size) mark_bad(vp, i);
    });
    defer_verdict_of(verdict, ip, message);
  });
}

void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &index, &out})
    check_on_current_device(*t, "index_select");
  const DimSplit s = split_at(x.shape(), dim);
  const int64_t n = index.numel(), inner = s.inner, size = s.size;
  MT_CUDA_DISPATCH_BYTES(x.element_size(), "index_select", E, [&] {
    MT_CUDA_DISPATCH_INDEX(index.dtype(), "index_select", I, [&] {
      const E* xp = ptr<E>(x);
      const I* ip = ptr<I>(index);
      E* op = ptr<E>(out);
      launch_linear(out.numel(), [=] __device__(int64_t e) {
        const int64_t r = e / inner, j = e % inner;
        const int64_t o = r / n, i = r % n, k = int64_t(ip[i]);
        op[e] = in_range(k, size) ? xp[(o * size + k) * inner + j] : E{};
      });
    });
  });
}

// index_add over a long index: positions sorted stably by target (sorted_positions.cuh), one
// block per (outer, run of equal targets), threads over inner, each element walking its run in
// index order. The same additions in the same order as walking the whole index per element.
template <class T>
__global__ void index_add_runs(T* self, const T* src, const int64_t* keys, const int32_t* order,
                               int64_t n, int64_t outer, int64_t size, int64_t inner,
                               acc_t<T> alpha) {
  for (int64_t item = blockIdx.x; item < outer * n; item += gridDim.x) {
    const int64_t o = item / n, k = item % n, target = keys[k];
    if (k > 0 && keys[k - 1] == target) continue;  // not the first of its run
    if (!in_range(target, size)) continue;
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) {
      T& dst = self[(o * size + target) * inner + j];
      T v = dst;
      for (int64_t m = k; m < n && keys[m] == target; ++m)
        accumulate(v, src[(o * n + int64_t(order[m])) * inner + j], alpha);
      dst = v;
    }
  }
}

// Indices up to this long are walked whole by every (outer, inner) thread; longer ones are sorted
// first (a walk per thread would serialise on the index: MoE's combine adds tokens x top-k rows).
constexpr int64_t kIndexAddWalkMax = 32;

void index_add(Tensor& self, int64_t dim, const Tensor& index, const Tensor& source, double alpha) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&self, &index, &source})
    check_on_current_device(*t, "index_add");
  const DimSplit s = split_at(self.shape(), dim);
  const int64_t n = index.numel(), inner = s.inner, size = s.size, outer = s.outer;
  if (n == 0 || outer * inner == 0) return;
  if (n <= kIndexAddWalkMax) {
    MT_CUDA_DISPATCH_ALL(self.dtype(), "index_add", T, [&] {
      MT_CUDA_DISPATCH_INDEX(index.dtype(), "index_add", I, [&] {
        T* sp = ptr<T>(self);
        const T* src = ptr<T>(source);
        const I* ip = ptr<I>(index);
        const acc_t<T> a = acc_t<T>(alpha);
        launch_linear(outer * inner, [=] __device__(int64_t t) {
          const int64_t o = t / inner, j = t % inner;
          for (int64_t i = 0; i < n; ++i) {
            const int64_t k = int64_t(ip[i]);
            if (in_range(k, size))
              accumulate(sp[(o * size + k) * inner + j], src[(o * n + i) * inner + j], a);
          }
        });
      });
    });
    return;
  }
  const SortedPositions sorted = sort_positions_by_value(index, size, "index_add");
  MT_CUDA_DISPATCH_ALL(self.dtype(), "index_add", T, [&] {
    index_add_runs<T>
        <<<unsigned(std::min<int64_t>(outer * n, 1 << 20)), threads_for_inner(inner), 0,
           current_stream()>>>(ptr<T>(self), ptr<T>(source), ptr<int64_t>(sorted.keys),
                               ptr<int32_t>(sorted.order), n, outer, size, inner, acc_t<T>(alpha));
    MT_CUDA_CHECK_LAUNCH();
  });
}

// index_copy: positions sorted stably by target (sorted_positions.cuh), so the last of each run
// of equal targets is the one the CPU leaves; one thread per (outer, position, inner element)
// copies only for those, every element written once, in parallel.
void index_copy(Tensor& self, int64_t dim, const Tensor& index, const Tensor& source) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&self, &index, &source})
    check_on_current_device(*t, "index_copy");
  const DimSplit s = split_at(self.shape(), dim);
  const int64_t n = index.numel(), inner = s.inner, size = s.size;
  if (n == 0 || s.outer * inner == 0) return;
  const SortedPositions sorted = sort_positions_by_value(index, size, "index_copy");
  MT_CUDA_DISPATCH_BYTES(self.element_size(), "index_copy", E, [&] {
    E* sp = ptr<E>(self);
    const E* src = ptr<E>(source);
    const int64_t* keys = ptr<int64_t>(sorted.keys);
    const int32_t* order = ptr<int32_t>(sorted.order);
    launch_linear(s.outer * n * inner, [=] __device__(int64_t e) {
      const int64_t r = e / inner, j = e % inner;
      const int64_t o = r / n, p = r % n, k = keys[p];
      if (!in_range(k, size) || (p + 1 < n && keys[p + 1] == k)) return;  // not the last
      sp[(o * size + k) * inner + j] = src[(o * n + order[p]) * inner + j];
    });
  });
}

void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &index, &out})
    check_on_current_device(*t, "gather");
  Shape xs = x.strides();
  const int64_t x_dim_stride = xs[size_t(dim)], x_size = x.size(dim);
  xs[size_t(dim)] = 0;  // the index supplies the position along dim
  MT_CUDA_DISPATCH_BYTES(x.element_size(), "gather", E, [&] {
    MT_CUDA_DISPATCH_INDEX(index.dtype(), "gather", I, [&] {
      const E* xp = ptr<E>(x);
      const I* ip = ptr<I>(index);
      E* op = ptr<E>(out);
      launch_elementwise<3>(index.shape(), {out.strides(), index.strides(), xs},
                            [=] __device__(const int64_t* off) {
                              const int64_t k = int64_t(ip[off[1]]);
                              op[off[0]] = in_range(k, x_size) ? xp[off[2] + k * x_dim_stride]
                                                               : E{};
                            });
    });
  });
}

// One thread per index position with p[dim] == 0, walking dim in increasing order: targets
// that collide (they differ only along dim) are applied in index order.
void scatter(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool add_values) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&self, &index, &src})
    check_on_current_device(*t, "scatter");
  if (index.numel() == 0) return;
  Shape ss = self.strides();
  const int64_t self_dim_stride = ss[size_t(dim)], self_size = self.size(dim);
  ss[size_t(dim)] = 0;
  Shape lines = index.shape();
  const int64_t n = lines[size_t(dim)];
  lines[size_t(dim)] = 1;
  const int64_t istride = index.stride(dim), sstride = src.stride(dim);
  const std::array<Shape, 3> strides{ss, index.strides(), src.strides()};
  MT_CUDA_DISPATCH_ALL(self.dtype(), "scatter", T, [&] {
    MT_CUDA_DISPATCH_INDEX(index.dtype(), "scatter", I, [&] {
      T* sp = ptr<T>(self);
      const I* ip = ptr<I>(index);
      const T* rp = ptr<T>(src);
      const acc_t<T> one = acc_t<T>(1);
      launch_elementwise<3>(lines, strides, [=] __device__(const int64_t* off) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t k = int64_t(ip[off[1] + i * istride]);
          if (!in_range(k, self_size)) continue;
          T& d = sp[off[0] + k * self_dim_stride];
          const T v = rp[off[2] + i * sstride];
          if (add_values) {
            accumulate(d, v, one);
          } else {
            d = v;
          }
        }
      });
    });
  });
}

MT_REGISTER_KERNEL(index_bounds_kernel, DeviceType::CUDA, index_bounds);
MT_REGISTER_KERNEL(index_select_kernel, DeviceType::CUDA, index_select);
MT_REGISTER_KERNEL(index_add_kernel, DeviceType::CUDA, index_add);
MT_REGISTER_KERNEL(index_copy_kernel, DeviceType::CUDA, index_copy);
MT_REGISTER_KERNEL(gather_kernel, DeviceType::CUDA, gather);
MT_REGISTER_KERNEL(scatter_kernel, DeviceType::CUDA, scatter);

}  // namespace
}  // namespace mt::runtime::cuda
