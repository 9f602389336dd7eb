// CUDA fused cross-entropy (runtime/kernels/loss.h): one block per row, read by 16-byte packs where
// the rows are aligned for them; the forward keeps only the row's logsumexp (no softmax is
// stored), the backward recomputes softmax from it. Targets are
// validated on the device and a bad one reported to the host later (deferred_verdict.cuh): the
// loss never makes the host wait.
#include <cuda/std/limits>

#include "runtime/cuda/amax.cuh"
#include "runtime/cuda/block_reduce.cuh"
#include "runtime/cuda/deferred_verdict.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/packed.cuh"
#include "runtime/kernels/loss.h"

namespace mt::runtime::cuda {
namespace {

constexpr int kRowThreads = 512;

template <class I>
__global__ void check_targets(const I* t, int64_t n, int64_t v, int64_t ignore_index,
                              unsigned long long* verdict) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ti = int64_t(t[i]);
    if (ti != ignore_index && (ti < 0 || ti >= v)) mark_bad(verdict, i);
  }
}

// f(j, x[j]) for the row's elements this thread owns: by packs of V (the row aligned for them),
// then the n % V last elements one by one.
template <int V, class T, class F>
__device__ inline void for_each_in_row(const T* row, int64_t n, F&& f) {
  const int64_t packs = n / V;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack<T, V> pk = load_pack<V>(row, p);
#pragma unroll
    for (int k = 0; k < V; ++k) f(p * V + k, pk.v[k]);
  }
  for (int64_t j = packs * V + threadIdx.x; j < n; j += blockDim.x) f(j, row[j]);
}

template <class T, class A, class I, int V>
__global__ void forward_rows(const T* x, const I* t, int64_t v, int64_t ignore_index, A* losses,
                             A* lse) {
  const int64_t r = blockIdx.x;
  const int64_t tr = int64_t(t[r]);
  // An invalid target (check_targets reports it to the host later) is not read: its row counts
  // as ignored until the error is raised, so nothing downstream sees garbage. The whole block
  // leaves together, so no thread misses a block reduction.
  if (tr == ignore_index || tr < 0 || tr >= v) {
    if (threadIdx.x == 0) losses[r] = lse[r] = A(0);
    return;
  }
  const T* row = x + r * v;
  A mx = -::cuda::std::numeric_limits<A>::infinity();
  for_each_in_row<V>(row, v, [&](int64_t, T xj) { mx = max(mx, A(xj)); });
  mx = block_max(mx, -::cuda::std::numeric_limits<A>::infinity());
  A s = 0;
  for_each_in_row<V>(row, v, [&](int64_t, T xj) { s += exp(A(xj) - mx); });
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const A l = mx + log(s);
    lse[r] = l;
    losses[r] = l - A(row[tr]);
  }
}

// amax (nullable): raised to max |dx| as stored (amax.cuh), once per row.
template <class T, class A, class I, int V>
__global__ void backward_rows(const T* x, const I* t, const A* lse, const A* grad, bool per_row,
                              int64_t v, int64_t ignore_index, T* dx, unsigned* amax) {
  const int64_t r = blockIdx.x;
  const int64_t tr = int64_t(t[r]);
  T* drow = dx + r * v;
  const bool skip = tr == ignore_index || tr < 0 || tr >= v;  // ignored, or invalid (forward_rows)
  const T* row = x + r * v;
  const A g = skip ? A(0) : grad[per_row ? r : 0], l = skip ? A(0) : lse[r];
  const auto d = [&](int64_t j, T xj) {
    return skip ? T(A(0)) : T(exp(A(xj) - l) * g - (j == tr ? g : A(0)));
  };
  const int64_t packs = v / V;
  unsigned dx_max = 0;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    Pack<T, V> pk = load_pack<V>(row, p);
#pragma unroll
    for (int k = 0; k < V; ++k) pk.v[k] = d(p * V + k, pk.v[k]);
    store_pack<V>(drow, p, pk);
    if (amax) {
#pragma unroll
      for (int k = 0; k < V; ++k) dx_max = max(dx_max, abs_bits(float(pk.v[k])));
    }
  }
  for (int64_t j = packs * V + threadIdx.x; j < v; j += blockDim.x) {
    const T dj = d(j, row[j]);
    drow[j] = dj;
    if (amax) dx_max = max(dx_max, abs_bits(float(dj)));
  }
  if (amax) raise_amax_over_block(dx_max, amax);  // no thread has returned: all are here
}

// Rows by packs when every row of x (and dx) starts aligned for them.
template <class T>
bool rows_packable(int64_t v, const T* x, const T* dx = nullptr) {
  constexpr int V = pack_width<T>();
  return v % V == 0 && packable<V>(x, dx);
}

template <class F>
decltype(auto) dispatch_index(const Tensor& t, F&& fn) {
  if (t.dtype() == DType::I32) return fn(ptr<int32_t>(t));
  MT_CHECK(t.dtype() == DType::I64, "cross_entropy: expected i32 or i64 targets, got ",
           dtype_name(t.dtype()));
  return fn(ptr<int64_t>(t));
}

void forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
             const BadElementMessage& bad_target, Tensor& losses, Tensor& lse) {
  check_on_current_device(logits, "cross_entropy");
  check_on_current_device(targets, "cross_entropy");
  const int64_t N = logits.size(0), V = logits.size(1);
  if (N == 0) return;
  const Tensor verdict = new_verdict();
  dispatch_index(targets, [&](auto* pt) {
    check_targets<<<blocks_for(N), kThreads, 0, current_stream()>>>(
        pt, N, V, ignore_index, ptr<unsigned long long>(verdict));
    MT_CUDA_CHECK_LAUNCH();
    defer_verdict_of(verdict, pt, bad_target);
    MT_CUDA_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", T, [&] {
      using A = acc_t<T>;
      using I = std::remove_cv_t<std::remove_pointer_t<decltype(pt)>>;
      const T* x = ptr<T>(logits);
      if (rows_packable(V, x)) {
        forward_rows<T, A, I, pack_width<T>()><<<unsigned(N), kRowThreads, 0, current_stream()>>>(
            x, pt, V, ignore_index, ptr<A>(losses), ptr<A>(lse));
      } else {
        forward_rows<T, A, I, 1><<<unsigned(N), kRowThreads, 0, current_stream()>>>(
            x, pt, V, ignore_index, ptr<A>(losses), ptr<A>(lse));
      }
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& grad,
              int64_t ignore_index, Tensor& grad_logits, Tensor& grad_amax) {
  check_on_current_device(logits, "cross_entropy_backward");
  const int64_t N = logits.size(0), V = logits.size(1);
  if (N == 0) return;
  dispatch_index(targets, [&](auto* pt) {
    MT_CUDA_DISPATCH_FLOATING(logits.dtype(), "cross_entropy_backward", T, [&] {
      using A = acc_t<T>;
      using I = std::remove_cv_t<std::remove_pointer_t<decltype(pt)>>;
      const T* x = ptr<T>(logits);
      T* dx = ptr<T>(grad_logits);
      const bool per_row = grad.numel() != 1;
      unsigned* amax = grad_amax.defined() ? ptr<unsigned>(grad_amax) : nullptr;  // f32's bits
      if (rows_packable<T>(V, x, dx)) {
        backward_rows<T, A, I, pack_width<T>()><<<unsigned(N), kRowThreads, 0, current_stream()>>>(
            x, pt, ptr<A>(lse), ptr<A>(grad), per_row, V, ignore_index, dx, amax);
      } else {
        backward_rows<T, A, I, 1><<<unsigned(N), kRowThreads, 0, current_stream()>>>(
            x, pt, ptr<A>(lse), ptr<A>(grad), per_row, V, ignore_index, dx, amax);
      }
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

MT_REGISTER_KERNEL(cross_entropy_forward_kernel, DeviceType::CUDA, forward);
MT_REGISTER_KERNEL(cross_entropy_backward_kernel, DeviceType::CUDA, backward);

}  // namespace
}  // namespace mt::runtime::cuda
