// CPU fused cross-entropy: per-row logsumexp forward, softmax-minus-onehot backward; rows are
// split over threads, each row reduced in a fixed order by the vectorised f32 helpers of
// vec_math.h (16-bit rows converted through an f32 buffer; f64 in plain f64 loops).
#include "runtime/kernels/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/cpu/float8_amax.h"
#include "runtime/cpu/loops.h"
#include "runtime/cpu/vec_math.h"

namespace mt::runtime::cpu {
namespace {

template <class I>
void check_targets(const I* t, int64_t n, int64_t v, int64_t ignore_index,
                   const BadElementMessage& bad_target) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ti = int64_t(t[i]);
    if (ti != ignore_index && (ti < 0 || ti >= v)) MT_FAIL(bad_target(i, ti));
  }
}

template <class F>
decltype(auto) dispatch_index(const Tensor& t, F&& fn) {
  if (t.dtype() == DType::I32) return fn(t.data<int32_t>());
  return fn(t.data<int64_t>());
}

// Row i as the compute type: the row itself for f32/f64, else converted into `buf`.
template <class T>
const compute_t<T>* as_compute_row(const T* row, int64_t n, compute_t<T>* buf) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    return row;
  } else {
    for (int64_t j = 0; j < n; ++j) buf[j] = float(row[j]);
    return buf;
  }
}

float row_logsumexp(const float* x, int64_t n) {
  const float mx = row_max(x, n);
  return mx + std::log(row_sum_exp(x, n, mx));
}

double row_logsumexp(const double* x, int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - mx);
  return mx + std::log(s);
}

// y[j] = exp(x[j] - lse) * g.
void row_softmax_scaled(const float* x, int64_t n, float lse, float g, float* y) {
  row_exp_scale(x, n, lse, g, y);
}

void row_softmax_scaled(const double* x, int64_t n, double lse, double g, double* y) {
  for (int64_t j = 0; j < n; ++j) y[j] = std::exp(x[j] - lse) * g;
}

void cpu_cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                               const BadElementMessage& bad_target, Tensor& losses, Tensor& lse) {
  const int64_t N = logits.size(0), V = logits.size(1);
  dispatch_index(targets, [&](auto* pt) {
    check_targets(pt, N, V, ignore_index, bad_target);
    dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      using A = compute_t<T>;
      const T* px = logits.data<T>();
      A* pl = losses.data<A>();
      A* ps = lse.data<A>();
      const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, V));
      parallel_for(N, grain, [&](int64_t begin, int64_t end) {
        std::vector<A> buf(std::is_same_v<T, A> ? 0 : static_cast<size_t>(V));
        for (int64_t i = begin; i < end; ++i) {
          const int64_t ti = int64_t(pt[i]);
          if (ti == ignore_index) {
            pl[i] = ps[i] = A(0);
            continue;
          }
          ps[i] = row_logsumexp(as_compute_row(px + i * V, V, buf.data()), V);
          pl[i] = ps[i] - A(px[i * V + ti]);
        }
      });
    });
  });
}

void cpu_cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                const Tensor& grad, int64_t ignore_index, Tensor& grad_logits,
                                Tensor& grad_amax) {
  const int64_t N = logits.size(0), V = logits.size(1);
  dispatch_index(targets, [&](auto* pt) {
    dispatch_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
      using T = decltype(tag);
      using A = compute_t<T>;
      const T* px = logits.data<T>();
      const A* ps = lse.data<A>();
      const A* pg = grad.data<A>();
      const bool per_row = grad.numel() != 1;
      T* pd = grad_logits.data<T>();
      const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, V));
      parallel_for(N, grain, [&](int64_t begin, int64_t end) {
        std::vector<A> buf(std::is_same_v<T, A> ? 0 : static_cast<size_t>(2 * V));
        for (int64_t i = begin; i < end; ++i) {
          T* drow = pd + i * V;
          const int64_t ti = int64_t(pt[i]);
          if (ti == ignore_index) {
            std::fill(drow, drow + V, T(A(0)));
            continue;
          }
          const A gi = pg[per_row ? i : 0];
          const A* row = as_compute_row(px + i * V, V, buf.data());
          A* out;
          if constexpr (std::is_same_v<T, A>) {
            out = drow;
          } else {
            out = buf.data() + V;
          }
          row_softmax_scaled(row, V, ps[i], gi, out);  // softmax * g
          out[ti] -= gi;                               // - onehot * g
          if constexpr (!std::is_same_v<T, A>)
            for (int64_t j = 0; j < V; ++j) drow[j] = T(out[j]);
        }
      });
    });
  });
  // A second pass here (the CPU gains nothing from fusing it).
  if (grad_amax.defined()) float8_amax_into(grad_logits, grad_amax);
}

}  // namespace

MT_REGISTER_KERNEL(cross_entropy_forward_kernel, DeviceType::CPU, cpu_cross_entropy_forward);
MT_REGISTER_KERNEL(cross_entropy_backward_kernel, DeviceType::CPU, cpu_cross_entropy_backward);

}  // namespace mt::runtime::cpu
