// CPU kernels of rms_norm: OpenMP over rows; dweight from per-block partial sums over a fixed
// partition of the rows (kRowBlock rows per block), added up in block order, so the result does
// not depend on the thread count. f32 and bf16 rows go through vec_math.h's vectorised row
// helpers (bf16 widened to f32, one rounding per output: f32_rows.h), f64 through plain loops.
#include "runtime/kernels/rms_norm.h"

#include <cmath>
#include <vector>

#include "runtime/cpu/f32_rows.h"
#include "runtime/cpu/float8_amax.h"
#include "runtime/cpu/loops.h"

namespace mt::runtime::cpu {
namespace {

constexpr int64_t kRowBlock = 16;  // rows per dweight partial sum (fixed: determinism)

template <class T>
void forward_impl(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd) {
  using C = compute_t<T>;
  const int64_t d = weight.numel(), rows = x.numel() / d;
  const T* xp = x.data<T>();
  const T* wp = weight.data<T>();
  T* yp = y.data<T>();
  C* rp = rstd.data<C>();
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / d);
  if constexpr (kF32Rows<T>) {
    std::vector<float> w32 = row_buffer<T>(d);
    const float* w = f32_row(wp, d, w32);
    parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> x32 = row_buffer<T>(d), y32 = row_buffer<T>(d);
      for (int64_t r = begin; r < end; ++r) {
        float* y = f32_out(yp + r * d, y32);
        rp[r] = row_rms_norm(f32_row(xp + r * d, d, x32), w, d, float(eps), y);
        store_row(y, d, yp + r * d);
      }
    });
    return;
  }
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = xp + r * d;
      T* yr = yp + r * d;
      C ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < d; ++i) ss += C(xr[i]) * C(xr[i]);
      const C rs = C(1) / std::sqrt(ss / C(d) + C(eps));
      rp[r] = rs;
      for (int64_t i = 0; i < d; ++i) yr[i] = T(C(xr[i]) * rs * C(wp[i]));
    }
  });
}

// y = x * r * w with r = (mean(x^2) + eps)^(-1/2):
//   dx = r * (dy * w) - x * r^3 / D * sum(dy * w * x),   dw = sum over rows of dy * x * r.
template <class T>
void backward_impl(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                   Tensor& dx, Tensor& dweight) {
  using C = compute_t<T>;
  const int64_t d = weight.numel(), rows = x.numel() / d;
  const T* gp = dy.data<T>();
  const T* xp = x.data<T>();
  const T* wp = weight.data<T>();
  const C* rp = rstd.data<C>();
  T* dxp = dx.defined() ? dx.data<T>() : nullptr;
  const bool want_dw = dweight.defined();
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<C> partial(want_dw ? size_t(blocks * d) : 0, C(0));
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / (kRowBlock * d));
  if constexpr (kF32Rows<T>) {
    std::vector<float> w32 = row_buffer<T>(d);
    const float* w = f32_row(wp, d, w32);
    parallel_for(blocks, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> dy32 = row_buffer<T>(d), x32 = row_buffer<T>(d), dx32 = row_buffer<T>(d);
      for (int64_t blk = begin; blk < end; ++blk) {
        for (int64_t r = blk * kRowBlock; r < std::min(rows, (blk + 1) * kRowBlock); ++r) {
          float* dxr = dxp ? f32_out(dxp + r * d, dx32) : nullptr;
          row_rms_norm_backward(f32_row(gp + r * d, d, dy32), f32_row(xp + r * d, d, x32), w, rp[r],
                                d, dxr, want_dw ? partial.data() + blk * d : nullptr);
          if (dxr) store_row(dxr, d, dxp + r * d);
        }
      }
    });
  } else {
    parallel_for(blocks, grain, [&](int64_t begin, int64_t end) {
      for (int64_t blk = begin; blk < end; ++blk) {
        C* pw = want_dw ? partial.data() + blk * d : nullptr;
        for (int64_t r = blk * kRowBlock; r < std::min(rows, (blk + 1) * kRowBlock); ++r) {
          const T* xr = xp + r * d;
          const T* gr = gp + r * d;
          const C rs = rp[r];
          if (dxp) {
            C dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < d; ++i) dot += C(gr[i]) * C(wp[i]) * C(xr[i]);
            const C coef = rs * rs * rs * dot / C(d);
            T* dxr = dxp + r * d;
            for (int64_t i = 0; i < d; ++i) dxr[i] = T(rs * C(gr[i]) * C(wp[i]) - coef * C(xr[i]));
          }
          if (pw) {
            for (int64_t i = 0; i < d; ++i) pw[i] += C(gr[i]) * C(xr[i]) * rs;
          }
        }
      }
    });
  }
  if (!want_dw) return;
  T* dwp = dweight.data<T>();
  parallel_for(d, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(blocks, 1)),
               [&](int64_t begin, int64_t end) {
                 std::vector<C> acc(size_t(end - begin), C(0));
                 for (int64_t blk = 0; blk < blocks; ++blk) {  // block order: deterministic
                   const C* pw = partial.data() + blk * d;
                   for (int64_t i = begin; i < end; ++i) acc[i - begin] += pw[i];
                 }
                 for (int64_t i = begin; i < end; ++i) dwp[i] = T(acc[i - begin]);
               });
}

void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd,
                      Tensor& y_amax) {
  dispatch_floating(x.dtype(), "rms_norm",
                    [&](auto tag) { forward_impl<decltype(tag)>(x, weight, eps, y, rstd); });
  // A second pass here (the CPU gains nothing from fusing it): the values the casts would read.
  if (y_amax.defined()) float8_amax_into(y, y_amax);
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       Tensor& dx, Tensor& dweight) {
  dispatch_floating(x.dtype(), "rms_norm_backward", [&](auto tag) {
    backward_impl<decltype(tag)>(dy, x, weight, rstd, dx, dweight);
  });
}

}  // namespace

MT_REGISTER_KERNEL(rms_norm_forward_kernel, DeviceType::CPU, rms_norm_forward);
MT_REGISTER_KERNEL(rms_norm_backward_kernel, DeviceType::CPU, rms_norm_backward);

}  // namespace mt::runtime::cpu
