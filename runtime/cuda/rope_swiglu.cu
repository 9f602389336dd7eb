// CUDA kernels of rope (one thread per rotated pair) and swiglu (one thread per element), both
// memory-bound single passes computing in f32 (f64 for f64).
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/rope.h"
#include "runtime/kernels/swiglu.h"

namespace mt::runtime::cuda {
namespace {

void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset,
          bool inverse, Tensor& out) {
  check_on_current_device(x, "apply_rope");
  const int64_t seq = x.shape()[1], heads = x.shape()[2], half = x.shape()[3] / 2;
  const int64_t pairs = x.numel() / 2;
  MT_CUDA_DISPATCH_FLOATING(x.dtype(), "apply_rope", T, [&] {
    using A = acc_t<T>;
    const T* xp = ptr<T>(x);
    T* op = ptr<T>(out);
    const A* cp = ptr<A>(cos);
    const A* sp = ptr<A>(sin);
    const A sign = inverse ? A(-1) : A(1);
    launch_linear(pairs, [=] __device__(int64_t p) {
      const int64_t i = p % half;
      const int64_t t = (p / half / heads) % seq;
      const int64_t pos = position_offset + t;
      const A c = cp[pos * half + i], s = sign * sp[pos * half + i];
      const A x0 = A(xp[2 * p]), x1 = A(xp[2 * p + 1]);
      op[2 * p] = T(x0 * c - x1 * s);
      op[2 * p + 1] = T(x0 * s + x1 * c);
    });
  });
}

template <class A>
__device__ inline A sigmoid_of(A g) {
  return A(1) / (A(1) + exp(-g));
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) {
  check_on_current_device(gate, "swiglu");
  MT_CUDA_DISPATCH_FLOATING(gate.dtype(), "swiglu", T, [&] {
    using A = acc_t<T>;
    const T* gp = ptr<T>(gate);
    const T* upp = ptr<T>(up);
    T* op = ptr<T>(out);
    launch_linear(gate.numel(), [=] __device__(int64_t i) {
      const A g = A(gp[i]);
      op[i] = T(g * sigmoid_of(g) * A(upp[i]));
    });
  });
}

void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup) {
  check_on_current_device(gate, "swiglu_backward");
  MT_CUDA_DISPATCH_FLOATING(gate.dtype(), "swiglu_backward", T, [&] {
    using A = acc_t<T>;
    const T* dp = ptr<T>(dy);
    const T* gp = ptr<T>(gate);
    const T* upp = ptr<T>(up);
    T* dgp = dgate.defined() ? ptr<T>(dgate) : nullptr;
    T* dupp = dup.defined() ? ptr<T>(dup) : nullptr;
    launch_linear(gate.numel(), [=] __device__(int64_t i) {
      const A g = A(gp[i]), d = A(dp[i]), s = sigmoid_of(g);
      if (dgp) dgp[i] = T(d * A(upp[i]) * s * (A(1) + g * (A(1) - s)));
      if (dupp) dupp[i] = T(d * g * s);
    });
  });
}

MT_REGISTER_KERNEL(rope_kernel, DeviceType::CUDA, rope);
MT_REGISTER_KERNEL(swiglu_forward_kernel, DeviceType::CUDA, swiglu_forward);
MT_REGISTER_KERNEL(swiglu_backward_kernel, DeviceType::CUDA, swiglu_backward);

}  // namespace
}  // namespace mt::runtime::cuda
