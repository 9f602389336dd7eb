// CPU kernels of swiglu: one pass over contiguous elements, OpenMP over element ranges; f32
// through the vectorised rows of vec_math.h, bf16 and f64 elementwise with std::exp.
#include "runtime/kernels/swiglu.h"

#include <cmath>
#include <type_traits>

#include "runtime/cpu/loops.h"
#include "runtime/cpu/vec_math.h"

namespace mt::runtime::cpu {
namespace {

template <class C>
inline C sigmoid_of(C g) {
  return C(1) / (C(1) + std::exp(-g));
}

template <class T>
void forward_impl(const Tensor& gate, const Tensor& up, Tensor& out) {
  using C = compute_t<T>;
  const T* gp = gate.data<T>();
  const T* up_ = up.data<T>();
  T* op = out.data<T>();
  parallel_for(gate.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>) {
      row_swiglu(gp + begin, up_ + begin, end - begin, op + begin);
    } else {
      for (int64_t i = begin; i < end; ++i) {
        const C g = C(gp[i]);
        op[i] = T(g * sigmoid_of(g) * C(up_[i]));
      }
    }
  });
}

template <class T>
void backward_impl(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                   Tensor& dup) {
  using C = compute_t<T>;
  const T* dp = dy.data<T>();
  const T* gp = gate.data<T>();
  const T* up_ = up.data<T>();
  T* dgp = dgate.defined() ? dgate.data<T>() : nullptr;
  T* dup_ = dup.defined() ? dup.data<T>() : nullptr;
  parallel_for(gate.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>) {
      row_swiglu_backward(dp + begin, gp + begin, up_ + begin, end - begin,
                          dgp ? dgp + begin : nullptr, dup_ ? dup_ + begin : nullptr);
    } else {
      for (int64_t i = begin; i < end; ++i) {
        const C g = C(gp[i]), d = C(dp[i]), s = sigmoid_of(g);
        if (dgp) dgp[i] = T(d * C(up_[i]) * s * (C(1) + g * (C(1) - s)));
        if (dup_) dup_[i] = T(d * g * s);
      }
    }
  });
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) {
  dispatch_floating(gate.dtype(), "swiglu",
                    [&](auto tag) { forward_impl<decltype(tag)>(gate, up, out); });
}

void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup) {
  dispatch_floating(gate.dtype(), "swiglu_backward",
                    [&](auto tag) { backward_impl<decltype(tag)>(dy, gate, up, dgate, dup); });
}

}  // namespace

MT_REGISTER_KERNEL(swiglu_forward_kernel, DeviceType::CPU, swiglu_forward);
MT_REGISTER_KERNEL(swiglu_backward_kernel, DeviceType::CPU, swiglu_backward);

}  // namespace mt::runtime::cpu
