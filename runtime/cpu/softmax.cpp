// CPU softmax / log_softmax, forward and backward. A contiguous tensor reduced along `dim` is
// viewed as [outer, n, inner]: inner == 1 (the last dim) runs row by row with the vectorised f32
// helpers of vec_math.h (16-bit rows converted through f32 buffers); otherwise a block of inner
// positions is reduced together (unit-stride inner loops). One thread owns each row.
#include "runtime/kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/cpu/loops.h"
#include "runtime/cpu/vec_math.h"

namespace mt::runtime::cpu {
namespace {

struct Geometry {
  int64_t outer = 1, n = 1, inner = 1;
};

Geometry geometry(const Shape& shape, int64_t dim) {
  Geometry g;
  for (int64_t i = 0; i < dim; ++i) g.outer *= shape[i];
  g.n = shape[dim];
  for (size_t i = size_t(dim) + 1; i < shape.size(); ++i) g.inner *= shape[i];
  return g;
}

constexpr int64_t kInnerBlock = 64;  // inner positions reduced together in the strided case

// Softmax of `lanes` interleaved rows: element j of lane l at x[j * stride + l].
template <class T>
void forward_lanes(const T* x, T* y, int64_t n, int64_t stride, int64_t lanes, bool log,
                   compute_t<T>* mx, compute_t<T>* s) {
  using A = compute_t<T>;
  std::fill(mx, mx + lanes, -std::numeric_limits<A>::infinity());
  std::fill(s, s + lanes, A(0));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t l = 0; l < lanes; ++l) mx[l] = std::max(mx[l], A(x[j * stride + l]));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t l = 0; l < lanes; ++l) s[l] += std::exp(A(x[j * stride + l]) - mx[l]);
  if (log) {
    for (int64_t l = 0; l < lanes; ++l) s[l] = mx[l] + std::log(s[l]);  // logsumexp
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < lanes; ++l) y[j * stride + l] = T(A(x[j * stride + l]) - s[l]);
  } else {
    for (int64_t l = 0; l < lanes; ++l) s[l] = A(1) / s[l];
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < lanes; ++l)
        y[j * stride + l] = T(std::exp(A(x[j * stride + l]) - mx[l]) * s[l]);
  }
}

// One contiguous row (the last dim), f32: vectorised max, sum of exp, and exp-scale passes.
void forward_row(const float* x, float* y, int64_t n, bool log) {
  const float mx = row_max(x, n);
  const float s = row_sum_exp(x, n, mx);
  if (log) {
    const float lse = mx + std::log(s);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) y[j] = x[j] - lse;
  } else {
    row_exp_scale(x, n, mx, 1.0f / s, y);
  }
}

void forward_row(const double* x, double* y, int64_t n, bool log) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - mx);
  if (log) {
    const double lse = mx + std::log(s);
    for (int64_t j = 0; j < n; ++j) y[j] = x[j] - lse;
  } else {
    const double inv = 1.0 / s;
    for (int64_t j = 0; j < n; ++j) y[j] = std::exp(x[j] - mx) * inv;
  }
}

// Backward of one contiguous row, f32 (see kernels/softmax.h for the formulas).
void backward_row(const float* y, const float* g, float* gi, int64_t n, bool log) {
  if (log) {
    row_exp_axpy(y, n, 0.0f, -row_sum(g, n), g, gi);
  } else {
    const float dot = row_dot(g, y, n);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) gi[j] = y[j] * (g[j] - dot);
  }
}

void backward_row(const double* y, const double* g, double* gi, int64_t n, bool log) {
  double acc = 0;
  if (log) {
    for (int64_t j = 0; j < n; ++j) acc += g[j];
    for (int64_t j = 0; j < n; ++j) gi[j] = g[j] - std::exp(y[j]) * acc;
  } else {
    for (int64_t j = 0; j < n; ++j) acc += g[j] * y[j];
    for (int64_t j = 0; j < n; ++j) gi[j] = y[j] * (g[j] - acc);
  }
}

// Runs fn(r, row pointers as compute type...) for rows [begin, end) of contiguous [rows, n]
// matrices: in place for f32/f64; 16-bit rows go through f32 buffers (inputs converted in,
// output `out` converted back).
template <class T, class Fn, class... In>
void rows_in_compute_type(int64_t begin, int64_t end, int64_t n, T* out, Fn&& fn, const In*... in) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    for (int64_t r = begin; r < end; ++r) fn((in + r * n)..., out + r * n);
  } else {
    std::vector<float> buf(static_cast<size_t>(n * (sizeof...(In) + 1)));
    for (int64_t r = begin; r < end; ++r) {
      size_t k = 0;
      auto load = [&](const T* src) {
        float* dst = buf.data() + (k++) * n;
        for (int64_t j = 0; j < n; ++j) dst[j] = float(src[r * n + j]);
        return static_cast<const float*>(dst);
      };
      float* res = buf.data() + sizeof...(In) * n;
      fn(load(in)..., res);
      for (int64_t j = 0; j < n; ++j) out[r * n + j] = T(res[j]);
    }
  }
}

template <class T>
void backward_lanes(const T* y, const T* g, T* gi, int64_t n, int64_t stride, int64_t lanes,
                    bool log, compute_t<T>* acc) {
  using A = compute_t<T>;
  std::fill(acc, acc + lanes, A(0));
  if (log) {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < lanes; ++l) acc[l] += A(g[j * stride + l]);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t k = j * stride + l;
        gi[k] = T(A(g[k]) - std::exp(A(y[k])) * acc[l]);
      }
  } else {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < lanes; ++l) acc[l] += A(g[j * stride + l]) * A(y[j * stride + l]);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t k = j * stride + l;
        gi[k] = T(A(y[k]) * (A(g[k]) - acc[l]));
      }
  }
}

// Calls fn(o, i0, lanes) over [outer] x [inner in blocks], in parallel over the blocks.
template <class Fn>
void for_each_block(const Geometry& geo, Fn&& fn) {
  const int64_t lanes = std::min(geo.inner, kInnerBlock);
  const int64_t blocks_per_outer = (geo.inner + lanes - 1) / lanes;
  const int64_t units = geo.outer * blocks_per_outer;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, geo.n * lanes));
  parallel_for(units, grain, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t o = u / blocks_per_outer;
      const int64_t i0 = (u % blocks_per_outer) * lanes;
      fn(o, i0, std::min(lanes, geo.inner - i0));
    }
  });
}

void cpu_softmax_forward(const Tensor& x, int64_t dim, bool log, Tensor& out) {
  const Geometry geo = geometry(x.shape(), dim);
  if (x.numel() == 0) return;
  dispatch_floating(x.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    using A = compute_t<T>;
    const T* px = x.data<T>();
    T* py = out.data<T>();
    if (geo.inner == 1) {
      const int64_t grain = std::max<int64_t>(1, kParallelGrain / geo.n);
      parallel_for(geo.outer, grain, [&](int64_t begin, int64_t end) {
        rows_in_compute_type(
            begin, end, geo.n, py, [&](const A* x, A* y) { forward_row(x, y, geo.n, log); }, px);
      });
      return;
    }
    for_each_block(geo, [&](int64_t o, int64_t i0, int64_t lanes) {
      A mx[kInnerBlock], s[kInnerBlock];
      const int64_t base = o * geo.n * geo.inner + i0;
      forward_lanes(px + base, py + base, geo.n, geo.inner, lanes, log, mx, s);
    });
  });
}

void cpu_softmax_backward(const Tensor& y, const Tensor& g, int64_t dim, bool log,
                          Tensor& grad_input) {
  const Geometry geo = geometry(y.shape(), dim);
  if (y.numel() == 0) return;
  dispatch_floating(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = compute_t<T>;
    const T* py = y.data<T>();
    const T* pg = g.data<T>();
    T* pgi = grad_input.data<T>();
    if (geo.inner == 1) {
      const int64_t grain = std::max<int64_t>(1, kParallelGrain / geo.n);
      parallel_for(geo.outer, grain, [&](int64_t begin, int64_t end) {
        rows_in_compute_type(
            begin, end, geo.n, pgi,
            [&](const A* y, const A* g, A* gi) { backward_row(y, g, gi, geo.n, log); }, py, pg);
      });
      return;
    }
    for_each_block(geo, [&](int64_t o, int64_t i0, int64_t lanes) {
      A acc[kInnerBlock];
      const int64_t base = o * geo.n * geo.inner + i0;
      backward_lanes(py + base, pg + base, pgi + base, geo.n, geo.inner, lanes, log, acc);
    });
  });
}

}  // namespace

MT_REGISTER_KERNEL(softmax_forward_kernel, DeviceType::CPU, cpu_softmax_forward);
MT_REGISTER_KERNEL(softmax_backward_kernel, DeviceType::CPU, cpu_softmax_backward);

}  // namespace mt::runtime::cpu
