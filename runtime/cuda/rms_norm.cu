// CUDA kernels of rms_norm. Forward and dx: one block per row (the row's sum reduced in the
// block). dweight: partial sums over fixed chunks of kChunkRows rows (threads over columns, so
// reads are coalesced), then the chunks added in order: deterministic, no atomics.
#include "runtime/cuda/block_reduce.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/rms_norm.h"

namespace mt::runtime::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int64_t kChunkRows = 128;

template <class T, class A>
__global__ void forward_rows(const T* x, const T* w, double eps, int64_t d, T* y, A* rstd) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * d;
  T* yr = y + r * d;
  A ss = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const A v = A(xr[i]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const A rs = A(1) / sqrt(ss / A(d) + A(eps));
  if (threadIdx.x == 0) rstd[r] = rs;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = T(A(xr[i]) * rs * A(w[i]));
}

template <class T, class A>
__global__ void dx_rows(const T* dy, const T* x, const T* w, const A* rstd, int64_t d, T* dx) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * d;
  const T* gr = dy + r * d;
  const A rs = rstd[r];
  A dot = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dot += A(gr[i]) * A(w[i]) * A(xr[i]);
  dot = block_sum(dot);
  const A coef = rs * rs * rs * dot / A(d);
  T* dxr = dx + r * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    dxr[i] = T(rs * A(gr[i]) * A(w[i]) - coef * A(xr[i]));
}

// partial[chunk, i] = sum over the chunk's rows of dy * x * rstd.
template <class T, class A>
__global__ void dweight_partial(const T* dy, const T* x, const A* rstd, int64_t rows, int64_t d,
                                A* partial) {
  // Chunks of rows on grid.x (up to 2^31 - 1; grid.y stops at 65535), column blocks on grid.y.
  const int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t chunk = blockIdx.x;
  if (i >= d) return;
  const int64_t r0 = chunk * kChunkRows, r1 = min(rows, r0 + kChunkRows);
  A acc = 0;
  for (int64_t r = r0; r < r1; ++r) acc += A(dy[r * d + i]) * A(x[r * d + i]) * rstd[r];
  partial[chunk * d + i] = acc;
}

template <class T, class A>
__global__ void dweight_sum(const A* partial, int64_t chunks, int64_t d, T* dw) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= d) return;
  A acc = 0;
  for (int64_t c = 0; c < chunks; ++c) acc += partial[c * d + i];
  dw[i] = T(acc);
}

void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd) {
  check_on_current_device(x, "rms_norm");
  const int64_t d = weight.numel(), rows = x.numel() / d;
  if (rows == 0) return;
  MT_CUDA_DISPATCH_FLOATING(x.dtype(), "rms_norm", T, [&] {
    using A = acc_t<T>;
    forward_rows<T, A><<<unsigned(rows), kRowThreads, 0, current_stream()>>>(
        ptr<T>(x), ptr<T>(weight), eps, d, ptr<T>(y), ptr<A>(rstd));
    MT_CUDA_CHECK_LAUNCH();
  });
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       Tensor& dx, Tensor& dweight) {
  check_on_current_device(x, "rms_norm_backward");
  const int64_t d = weight.numel(), rows = x.numel() / d;
  MT_CUDA_DISPATCH_FLOATING(x.dtype(), "rms_norm_backward", T, [&] {
    using A = acc_t<T>;
    if (dx.defined() && rows > 0) {
      dx_rows<T, A><<<unsigned(rows), kRowThreads, 0, current_stream()>>>(
          ptr<T>(dy), ptr<T>(x), ptr<T>(weight), ptr<A>(rstd), d, ptr<T>(dx));
      MT_CUDA_CHECK_LAUNCH();
    }
    if (!dweight.defined()) return;
    if (rows == 0) {
      dweight.zero_();
      return;
    }
    const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
    Tensor partial = Tensor::empty({chunks, d}, x.options().with_dtype(dtype_v<A>));
    const unsigned col_blocks = unsigned((d + kThreads - 1) / kThreads);
    MT_CHECK(col_blocks <= 65535u, "rms_norm_backward: ", d, " features exceed the kernel's limit");
    dweight_partial<T, A><<<dim3(unsigned(chunks), col_blocks), kThreads, 0, current_stream()>>>(
        ptr<T>(dy), ptr<T>(x), ptr<A>(rstd), rows, d, ptr<A>(partial));
    MT_CUDA_CHECK_LAUNCH();
    dweight_sum<T, A><<<col_blocks, kThreads, 0, current_stream()>>>(ptr<A>(partial), chunks, d,
                                                                    ptr<T>(dweight));
    MT_CUDA_CHECK_LAUNCH();
  });
}

MT_REGISTER_KERNEL(rms_norm_forward_kernel, DeviceType::CUDA, rms_norm_forward);
MT_REGISTER_KERNEL(rms_norm_backward_kernel, DeviceType::CUDA, rms_norm_backward);

}  // namespace
}  // namespace mt::runtime::cuda
