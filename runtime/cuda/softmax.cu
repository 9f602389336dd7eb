// CUDA softmax / log_softmax, forward and backward (runtime/kernels/softmax.h). A contiguous
// tensor reduced along `dim` is viewed as [outer, n, inner]:
// - inner == 1 (the last dim): one block per row; max, sum and output passes over the row with
//   block reductions (fixed tree order: deterministic);
// - otherwise one thread per (outer, inner) column walking its n elements (neighbouring threads
//   read neighbouring columns, so loads are coalesced).
// Computed in f32 (f64 for f64).
#include <limits>

#include "runtime/cuda/block_reduce.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/softmax.h"

namespace mt::runtime::cuda {
namespace {

constexpr int kRowThreads = 256;

struct Geometry {
  int64_t outer = 1, n = 1, inner = 1;
};

Geometry geometry(const Shape& shape, int64_t dim) {
  Geometry g;
  for (int64_t i = 0; i < dim; ++i) g.outer *= shape[size_t(i)];
  g.n = shape[size_t(dim)];
  for (size_t i = size_t(dim) + 1; i < shape.size(); ++i) g.inner *= shape[i];
  return g;
}

template <class A>
__device__ inline A exp_of(A x) {
  if constexpr (std::is_same_v<A, float>)
    return expf(x);
  else
    return ::exp(x);
}
template <class A>
__device__ inline A log_of(A x) {
  if constexpr (std::is_same_v<A, float>)
    return logf(x);
  else
    return ::log(x);
}

// Softmax of the n elements x[0], x[s], ... into y (log: log_softmax), given their max and
// sum of exp(x - max): one element.
template <class T>
__device__ inline T softmax_value(T x, acc_t<T> mx, acc_t<T> sum, bool log) {
  using A = acc_t<T>;
  return convert<T>(log ? A(x) - (mx + log_of(sum)) : exp_of(A(x) - mx) / sum);
}

template <class T>
__device__ inline T softmax_grad(T y, T g, acc_t<T> acc, bool log) {
  using A = acc_t<T>;
  return convert<T>(log ? A(g) - exp_of(A(y)) * acc : A(y) * (A(g) - acc));
}

template <class T>
__global__ void forward_rows(const T* x, T* y, int64_t rows, int64_t n, bool log) {
  using A = acc_t<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    A mx = -std::numeric_limits<A>::infinity();
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = max(mx, A(xr[j]));
    mx = block_max(mx, -std::numeric_limits<A>::infinity());
    A s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += exp_of(A(xr[j]) - mx);
    s = block_sum(s);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = softmax_value(xr[j], mx, s, log);
  }
}

template <class T>
__global__ void forward_cols(const T* x, T* y, Geometry g, bool log) {
  using A = acc_t<T>;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < g.outer * g.inner;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (c / g.inner) * g.n * g.inner + c % g.inner;
    const T* xc = x + base;
    T* yc = y + base;
    A mx = -std::numeric_limits<A>::infinity();
    for (int64_t j = 0; j < g.n; ++j) mx = max(mx, A(xc[j * g.inner]));
    A s = 0;
    for (int64_t j = 0; j < g.n; ++j) s += exp_of(A(xc[j * g.inner]) - mx);
    for (int64_t j = 0; j < g.n; ++j) yc[j * g.inner] = softmax_value(xc[j * g.inner], mx, s, log);
  }
}

// acc = sum(g) (log) or sum(g * y), then the gradient.
template <class T>
__global__ void backward_rows(const T* y, const T* g, T* gi, int64_t rows, int64_t n, bool log) {
  using A = acc_t<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* yr = y + r * n;
    const T* gr = g + r * n;
    A acc = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      acc += log ? A(gr[j]) : A(gr[j]) * A(yr[j]);
    acc = block_sum(acc);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      gi[r * n + j] = softmax_grad(yr[j], gr[j], acc, log);
  }
}

template <class T>
__global__ void backward_cols(const T* y, const T* g, T* gi, Geometry geo, bool log) {
  using A = acc_t<T>;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < geo.outer * geo.inner;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (c / geo.inner) * geo.n * geo.inner + c % geo.inner;
    A acc = 0;
    for (int64_t j = 0; j < geo.n; ++j) {
      const int64_t k = base + j * geo.inner;
      acc += log ? A(g[k]) : A(g[k]) * A(y[k]);
    }
    for (int64_t j = 0; j < geo.n; ++j) {
      const int64_t k = base + j * geo.inner;
      gi[k] = softmax_grad(y[k], g[k], acc, log);
    }
  }
}

unsigned row_grid(int64_t rows) { return unsigned(std::min<int64_t>(rows, 1 << 20)); }

void softmax_forward(const Tensor& x, int64_t dim, bool log, Tensor& out) {
  check_on_current_device(x, "softmax");
  check_on_current_device(out, "softmax");
  const Geometry g = geometry(x.shape(), dim);
  if (x.numel() == 0) return;
  MT_CUDA_DISPATCH_FLOATING(x.dtype(), "softmax", T, [&] {
    if (g.inner == 1) {
      forward_rows<T><<<row_grid(g.outer), kRowThreads, 0, current_stream()>>>(
          ptr<T>(x), ptr<T>(out), g.outer, g.n, log);
    } else {
      forward_cols<T><<<blocks_for(g.outer * g.inner), kThreads, 0, current_stream()>>>(
          ptr<T>(x), ptr<T>(out), g, log);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

void softmax_backward(const Tensor& y, const Tensor& grad, int64_t dim, bool log,
                      Tensor& grad_input) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&y, &grad, &grad_input})
    check_on_current_device(*t, "softmax_backward");
  const Geometry g = geometry(y.shape(), dim);
  if (y.numel() == 0) return;
  MT_CUDA_DISPATCH_FLOATING(y.dtype(), "softmax_backward", T, [&] {
    if (g.inner == 1) {
      backward_rows<T><<<row_grid(g.outer), kRowThreads, 0, current_stream()>>>(
          ptr<T>(y), ptr<T>(grad), ptr<T>(grad_input), g.outer, g.n, log);
    } else {
      backward_cols<T><<<blocks_for(g.outer * g.inner), kThreads, 0, current_stream()>>>(
          ptr<T>(y), ptr<T>(grad), ptr<T>(grad_input), g, log);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

MT_REGISTER_KERNEL(softmax_forward_kernel, DeviceType::CUDA, softmax_forward);
MT_REGISTER_KERNEL(softmax_backward_kernel, DeviceType::CUDA, softmax_backward);

}  // namespace
}  // namespace mt::runtime::cuda
