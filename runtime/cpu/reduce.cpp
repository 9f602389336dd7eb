// CPU reduction kernels.
//
// Geometry: x's dims are split into kept dims (K outputs) and reduced dims (R elements per
// output), each coalesced. Reduced elements are numbered r = 0..R-1 in row-major order of the
// reduced dims and cut into fixed chunks of kChunk. Work items are (output, chunk) pairs, run in
// parallel; the chunk partials of an output are then combined in chunk order.
//
// Sum order (the same whatever the layout or the thread count): within a chunk, element r goes
// to lane r % 8; each lane adds its elements in increasing r; the 8 lanes are combined as
// ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); chunk partials are added in chunk order. Accumulation is
// in f64 for floating dtypes (wrapping u64 for integers). The lanes let the compiler vectorise
// without reassociating. Two loop nests compute this order:
// - inner: when the reduced dims are the fast ones, each item walks its output's elements;
// - outer: when the innermost kept dim is contiguous (e.g. a bias gradient, summing [N, C] over
//   N), an item accumulates a block of neighbouring outputs row by row, so loads are contiguous.
#include "runtime/kernels/reduce.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "runtime/cpu/loops.h"

namespace mt::runtime::cpu {
namespace {

constexpr int64_t kChunk = 16384;  // reduced elements per partial (a multiple of kLanes)
constexpr int kLanes = 8;
constexpr int64_t kBlock = 256;  // outputs per item in the outer nest

struct Geometry {
  Shape kept_shape, kept_strides;  // coalesced; x strides (out is contiguous in kept order)
  Shape red_shape, red_strides;    // coalesced; x strides
  int64_t K = 1, R = 1;

  // Element offset in x of output k / reduced element r (row-major decomposition).
  static int64_t offset_of(int64_t i, const Shape& shape, const Shape& strides, size_t ndims) {
    int64_t off = 0;
    for (size_t d = ndims; d-- > 0;) {
      off += (i % shape[d]) * strides[d];
      i /= shape[d];
    }
    return off;
  }
  int64_t kept_offset(int64_t k) const {
    return offset_of(k, kept_shape, kept_strides, kept_shape.size());
  }
};

Geometry make_geometry(const Tensor& x, const std::vector<int64_t>& dims) {
  Geometry g;
  std::vector<bool> reduced(size_t(x.dim()), false);
  for (int64_t d : dims) reduced[size_t(d)] = true;
  auto push = [](Shape& shape, Shape& strides, int64_t size, int64_t stride) {
    if (size == 1) return;
    if (!shape.empty() && strides.back() == stride * size) {
      shape.back() *= size;
      strides.back() = stride;
      return;
    }
    shape.push_back(size);
    strides.push_back(stride);
  };
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (reduced[size_t(d)]) {
      push(g.red_shape, g.red_strides, x.size(d), x.stride(d));
    } else {
      push(g.kept_shape, g.kept_strides, x.size(d), x.stride(d));
    }
  }
  if (g.kept_shape.empty()) g.kept_shape = {1}, g.kept_strides = {0};
  if (g.red_shape.empty()) g.red_shape = {1}, g.red_strides = {0};
  g.K = numel_of(g.kept_shape);
  g.R = numel_of(g.red_shape);
  return g;
}

// Calls fn(offset, n, stride, r) for the runs along the innermost reduced dim that cover the
// reduced elements [r0, r1): elements r..r+n-1 sit at offset + j * stride.
template <class Fn>
void for_each_run(const Geometry& g, int64_t r0, int64_t r1, Fn&& fn) {
  const int64_t inner = g.red_shape.back(), stride = g.red_strides.back();
  const size_t outer_dims = g.red_shape.size() - 1;
  int64_t r = r0;
  while (r < r1) {
    const int64_t outer = r / inner, j0 = r % inner;
    const int64_t n = std::min(inner - j0, r1 - r);
    const int64_t off = Geometry::offset_of(outer, g.red_shape, g.red_strides, outer_dims);
    fn(off + j0 * stride, n, stride, r);
    r += n;
  }
}

template <class T>
using AccT = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, uint64_t>;

template <class T>
inline AccT<T> load_acc(T v) {
  if constexpr (std::is_floating_point_v<compute_t<T>>) {
    return double(compute_t<T>(v));
  } else {
    return uint64_t(int64_t(v));  // wraps; bool -> 0/1
  }
}

template <class Acc>
inline Acc combine_lanes(const Acc* l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// Lane sums of the run p[0], p[s], ... (n elements; the first is reduced element r).
template <class T, class Acc>
inline void add_run(const T* p, int64_t n, int64_t s, int64_t r, Acc* lanes) {
  int64_t j = 0;
  for (; j < n && (r + j) % kLanes != 0; ++j) lanes[(r + j) % kLanes] += load_acc(p[j * s]);
  Acc acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = lanes[l];
  if (s == 1) {
    for (; j + kLanes <= n; j += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += load_acc(p[j + l]);
  } else {
    for (; j + kLanes <= n; j += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += load_acc(p[(j + l) * s]);
  }
  for (int l = 0; l < kLanes; ++l) lanes[l] = acc[l];
  for (; j < n; ++j) lanes[(r + j) % kLanes] += load_acc(p[j * s]);
}

// partial[k * nchunks + c] for every output k and chunk c.
template <class T>
std::vector<AccT<T>> sum_partials(const Tensor& x, const Geometry& g, int64_t nchunks) {
  using Acc = AccT<T>;
  const T* px = static_cast<const T*>(x.data_ptr());
  std::vector<Acc> partials(size_t(g.K * nchunks));
  const int64_t inner_k = g.kept_shape.back();
  const bool outer_nest = g.kept_strides.back() == 1 && inner_k >= 16 && g.red_strides.back() != 1;
  if (!outer_nest) {
    const int64_t items = g.K * nchunks;
    const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::min(g.R, kChunk));
    parallel_for(items, grain, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t k = item / nchunks, c = item % nchunks;
        const T* base = px + g.kept_offset(k);
        Acc lanes[kLanes] = {};
        for_each_run(g, c * kChunk, std::min(g.R, (c + 1) * kChunk),
                     [&](int64_t off, int64_t n, int64_t s, int64_t r) {
                       add_run(base + off, n, s, r, lanes);
                     });
        partials[size_t(item)] = combine_lanes(lanes);
      }
    });
    return partials;
  }
  // Outer nest: items are (kept outer index, block of kBlock inner outputs, chunk).
  const int64_t outer_k = g.K / inner_k;
  const int64_t blocks = (inner_k + kBlock - 1) / kBlock;
  const int64_t items = outer_k * blocks * nchunks;
  const int64_t per_item = std::min(g.R, kChunk) * std::min(inner_k, kBlock);
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / per_item);
  parallel_for(items, grain, [&](int64_t begin, int64_t end) {
    std::vector<Acc> acc(size_t(kLanes * kBlock));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t c = item % nchunks, rest = item / nchunks;
      const int64_t b = rest % blocks, ko = rest / blocks;
      const int64_t j0 = b * kBlock, jn = std::min(kBlock, inner_k - j0);
      const int64_t k0 = ko * inner_k + j0;
      const T* base = px + g.kept_offset(k0);
      std::fill(acc.begin(), acc.end(), Acc(0));
      for_each_run(g, c * kChunk, std::min(g.R, (c + 1) * kChunk),
                   [&](int64_t off, int64_t n, int64_t s, int64_t r) {
                     for (int64_t i = 0; i < n; ++i) {
                       Acc* a = acc.data() + ((r + i) % kLanes) * kBlock;
                       const T* p = base + off + i * s;
                       for (int64_t j = 0; j < jn; ++j) a[j] += load_acc(p[j]);
                     }
                   });
      for (int64_t j = 0; j < jn; ++j) {
        Acc l[kLanes];
        for (int lane = 0; lane < kLanes; ++lane) l[lane] = acc[size_t(lane * kBlock + j)];
        partials[size_t((k0 + j) * nchunks + c)] = combine_lanes(l);
      }
    }
  });
  return partials;
}

void cpu_sum(const Tensor& x, const std::vector<int64_t>& dims, double divisor, const Tensor& out) {
  dispatch_dtype(x.dtype(), "sum", [&](auto tag) {
    using T = decltype(tag);
    using Acc = AccT<T>;
    constexpr bool kFloat = std::is_floating_point_v<compute_t<T>>;
    using Out = std::conditional_t<kFloat, T, int64_t>;
    MT_CHECK(out.dtype() == dtype_v<Out> && out.is_contiguous(), "sum: bad output");
    if (x.numel() == 0 || out.numel() == 0) {  // sums over nothing are 0 (mean: 0/0 = NaN)
      Out* po = static_cast<Out*>(out.data_ptr());
      for (int64_t k = 0; k < out.numel(); ++k) {
        if constexpr (kFloat)
          po[k] = Out(compute_t<T>(0.0 / divisor));
        else
          po[k] = 0;
      }
      return;
    }
    const Geometry g = make_geometry(x, dims);
    const int64_t nchunks = (g.R + kChunk - 1) / kChunk;
    const std::vector<Acc> partials = sum_partials<T>(x, g, nchunks);
    Out* po = static_cast<Out*>(out.data_ptr());
    parallel_for(g.K, kParallelGrain / std::max<int64_t>(nchunks, 1), [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        Acc total = partials[size_t(k * nchunks)];
        for (int64_t c = 1; c < nchunks; ++c) total += partials[size_t(k * nchunks + c)];
        if constexpr (kFloat) {
          po[k] = Out(compute_t<T>(divisor == 1.0 ? total : total / divisor));
        } else {
          po[k] = int64_t(total);
        }
      }
    });
  });
}

// The first maximum of its run; NaN beats everything (the first NaN wins).
template <class C>
inline bool better(C v, C best) {
  if constexpr (std::is_floating_point_v<C>) {
    return v > best || (v != v && best == best);
  } else {
    return v > best;
  }
}

void cpu_max(const Tensor& x, const std::vector<int64_t>& dims, const Tensor& values,
             const Tensor& indices) {
  dispatch_dtype(x.dtype(), "max", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const Geometry g = make_geometry(x, dims);
    if (g.K == 0) return;
    MT_CHECK(g.R > 0, "max: cannot reduce over zero elements (shape ", x.shape(), ")");
    const int64_t nchunks = (g.R + kChunk - 1) / kChunk;
    std::vector<C> best(size_t(g.K * nchunks));
    std::vector<int64_t> best_idx(best.size());
    const T* px = static_cast<const T*>(x.data_ptr());
    auto first_of_chunk = [&](const T* base, int64_t c) {
      return C(
          base[Geometry::offset_of(c * kChunk, g.red_shape, g.red_strides, g.red_shape.size())]);
    };
    const int64_t inner_k = g.kept_shape.back();
    if (!(g.kept_strides.back() == 1 && inner_k >= 16 && g.red_strides.back() != 1)) {
      // Inner nest: each item scans its output's elements of one chunk.
      const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::min(g.R, kChunk));
      parallel_for(g.K * nchunks, grain, [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
          const int64_t k = item / nchunks, c = item % nchunks;
          const T* base = px + g.kept_offset(k);
          C b = first_of_chunk(base, c);
          int64_t bi = c * kChunk;
          for_each_run(g, c * kChunk, std::min(g.R, (c + 1) * kChunk),
                       [&](int64_t off, int64_t n, int64_t s, int64_t r) {
                         const T* p = base + off;
                         for (int64_t j = 0; j < n; ++j) {
                           const C v = C(p[j * s]);
                           if (better<C>(v, b)) b = v, bi = r + j;
                         }
                       });
          best[size_t(item)] = b;
          best_idx[size_t(item)] = bi;
        }
      });
    } else {
      // Outer nest: an item scans a block of neighbouring outputs row by row (contiguous loads).
      const int64_t outer_k = g.K / inner_k;
      const int64_t blocks = (inner_k + kBlock - 1) / kBlock;
      const int64_t per_item = std::min(g.R, kChunk) * std::min(inner_k, kBlock);
      const int64_t grain = std::max<int64_t>(1, kParallelGrain / per_item);
      parallel_for(outer_k * blocks * nchunks, grain, [&](int64_t begin, int64_t end) {
        std::vector<C> b(static_cast<size_t>(kBlock));
        std::vector<int64_t> bi(static_cast<size_t>(kBlock));
        for (int64_t item = begin; item < end; ++item) {
          const int64_t c = item % nchunks, rest = item / nchunks;
          const int64_t blk = rest % blocks, ko = rest / blocks;
          const int64_t j0 = blk * kBlock, jn = std::min(kBlock, inner_k - j0);
          const int64_t k0 = ko * inner_k + j0;
          const T* base = px + g.kept_offset(k0);
          for (int64_t j = 0; j < jn; ++j) b[j] = first_of_chunk(base + j, c), bi[j] = c * kChunk;
          for_each_run(g, c * kChunk, std::min(g.R, (c + 1) * kChunk),
                       [&](int64_t off, int64_t n, int64_t s, int64_t r) {
                         for (int64_t i = 0; i < n; ++i) {
                           const T* p = base + off + i * s;
                           for (int64_t j = 0; j < jn; ++j) {
                             const C v = C(p[j]);
                             if (better<C>(v, C(b[j]))) b[j] = v, bi[j] = r + i;
                           }
                         }
                       });
          for (int64_t j = 0; j < jn; ++j) {
            best[size_t((k0 + j) * nchunks + c)] = b[j];
            best_idx[size_t((k0 + j) * nchunks + c)] = bi[j];
          }
        }
      });
    }
    T* pv = values.defined() ? static_cast<T*>(values.data_ptr()) : nullptr;
    int64_t* pi = indices.defined() ? indices.data<int64_t>() : nullptr;
    for (int64_t k = 0; k < g.K; ++k) {
      C b = best[size_t(k * nchunks)];
      int64_t bi = best_idx[size_t(k * nchunks)];
      for (int64_t c = 1; c < nchunks; ++c) {
        if (better<C>(best[size_t(k * nchunks + c)], b))
          b = best[size_t(k * nchunks + c)], bi = best_idx[size_t(k * nchunks + c)];
      }
      if (pv) pv[k] = T(b);
      if (pi) pi[k] = bi;
    }
  });
}

}  // namespace

MT_REGISTER_KERNEL(sum_kernel, DeviceType::CPU, cpu_sum);
MT_REGISTER_KERNEL(max_kernel, DeviceType::CPU, cpu_max);

}  // namespace mt::runtime::cpu
