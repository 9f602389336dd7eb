// CUDA kernels of the unary elementwise ops and clamp (runtime/kernels/elementwise.h), with the
// CPU backend's semantics (runtime/cpu/elementwise.cpp): integers wrap, 16-bit floats compute in
// f32, NaN propagates through relu and clamp. The op is a runtime switch inside one kernel per
// dtype (a uniform branch: the loop is memory-bound), which keeps the number of instantiations low.
// Contiguous operands take the vectorized loop (launch_map).
#include <cmath>

#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/elementwise.h"

namespace mt::runtime::cuda {
namespace {

template <class T>
inline constexpr bool kIsInt = std::is_integral_v<T> && !std::is_same_v<T, bool>;

template <class T>
__device__ inline T wrap_neg(T a) {
  using U = std::make_unsigned_t<T>;
  return T(U(0) - U(a));
}

// Float math in the compute type (f32 calls the f32 functions, f64 the f64 ones).
template <class C>
__device__ inline C exp_of(C x) {
  if constexpr (std::is_same_v<C, float>)
    return expf(x);
  else
    return ::exp(x);
}

template <class C>
__device__ inline C float_unary(UnaryOp op, C x) {
  constexpr bool f = std::is_same_v<C, float>;
  switch (op) {
    case UnaryOp::Neg:
      return -x;
    case UnaryOp::Exp:
      return exp_of(x);
    case UnaryOp::Log:
      if constexpr (f)
        return logf(x);
      else
        return ::log(x);
    case UnaryOp::Sqrt:
      if constexpr (f)
        return sqrtf(x);
      else
        return ::sqrt(x);
    case UnaryOp::Rsqrt:
      if constexpr (f)
        return 1.0f / sqrtf(x);
      else
        return 1.0 / ::sqrt(x);
    case UnaryOp::Abs:
      if constexpr (f)
        return fabsf(x);
      else
        return ::fabs(x);
    case UnaryOp::Sin:
      if constexpr (f)
        return sinf(x);
      else
        return ::sin(x);
    case UnaryOp::Cos:
      if constexpr (f)
        return cosf(x);
      else
        return ::cos(x);
    case UnaryOp::Tanh:
      if constexpr (f)
        return tanhf(x);
      else
        return ::tanh(x);
    case UnaryOp::Sigmoid:
      return C(1) / (C(1) + exp_of(-x));
    case UnaryOp::Relu:
      return x < C(0) ? C(0) : x;  // NaN stays NaN
    case UnaryOp::Silu:
      return x / (C(1) + exp_of(-x));
    case UnaryOp::Square:
      return x * x;
    case UnaryOp::Reciprocal:
      return C(1) / x;
    default:
      return x;  // LogicalNot is handled by the caller
  }
}

template <class C>
__device__ inline C int_unary(UnaryOp op, C x) {
  using U = std::make_unsigned_t<C>;
  switch (op) {
    case UnaryOp::Neg:
      return wrap_neg(x);
    case UnaryOp::Abs:
      return x < 0 ? wrap_neg(x) : x;
    case UnaryOp::Square:
      return C(U(x) * U(x));
    case UnaryOp::Relu:
      return x < 0 ? C(0) : x;
    default:
      return x;  // rejected on the host
  }
}

// op(x) for a non-bool T, computed in acc_t<T>.
template <class T>
__device__ inline T apply_unary(UnaryOp op, T x) {
  if constexpr (kIsInt<T>) {
    return int_unary(op, x);
  } else {
    return convert<T>(float_unary(op, acc_t<T>(x)));
  }
}

// Which (op, dtype) pairs exist (the CPU's unary_supported).
bool unary_supported(UnaryOp op, DType t) {
  switch (op) {
    case UnaryOp::LogicalNot:
      return true;
    case UnaryOp::Neg:
    case UnaryOp::Abs:
    case UnaryOp::Square:
    case UnaryOp::Relu:
      return t != DType::Bool;
    default:
      return is_floating(t);
  }
}

void unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  check_on_current_device(x, "unary");
  check_on_current_device(out, "unary");
  MT_CHECK(unary_supported(op, x.dtype()), "unary op ", int(op), ": not supported for ",
           dtype_name(x.dtype()));
  MT_CUDA_DISPATCH_ALL(x.dtype(), "unary", T, [&] {
    using C = acc_t<T>;
    if (op == UnaryOp::LogicalNot) {
      launch_map<bool, T>(out, [] __device__(T v) { return C(v) == C(0); }, x);
      return;
    }
    if constexpr (!std::is_same_v<T, bool>)
      launch_map<T, T>(out, [=] __device__(T v) { return apply_unary(op, v); }, x);
  });
}

// The smallest/largest integer T within [lo, hi] (the CPU's int_bound).
template <class T>
T int_bound(double v, bool lower) {
  const double r = lower ? std::ceil(v) : std::floor(v);
  if (!(r > double(std::numeric_limits<T>::min()))) return std::numeric_limits<T>::min();
  if (!(r < double(std::numeric_limits<T>::max()))) return std::numeric_limits<T>::max();
  return T(r);
}

void clamp(const Tensor& x, double lo, double hi, const Tensor& out) {
  check_on_current_device(x, "clamp");
  check_on_current_device(out, "clamp");
  MT_CHECK(x.dtype() != DType::Bool, "clamp: not supported for bool tensors");
  MT_CUDA_DISPATCH_ALL(x.dtype(), "clamp", T, [&] {
    if constexpr (!std::is_same_v<T, bool>) {
      using C = acc_t<T>;
      C l, h;
      if constexpr (kIsInt<T>) {
        l = int_bound<T>(lo, true);
        h = int_bound<T>(hi, false);
      } else {
        l = C(lo);
        h = C(hi);
      }
      launch_map<T, T>(
          out,
          [=] __device__(T e) {
            const C v = C(e);
            C r = v < l ? l : v;  // NaN stays NaN
            r = r > h ? h : r;
            return convert<T>(r);
          },
          x);
    }
  });
}

MT_REGISTER_KERNEL(unary_kernel, DeviceType::CUDA, unary);
MT_REGISTER_KERNEL(clamp_kernel, DeviceType::CUDA, clamp);

}  // namespace
}  // namespace mt::runtime::cuda
