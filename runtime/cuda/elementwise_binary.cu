// CUDA kernels of the binary elementwise ops, their scalar forms, add_ with alpha and where
// (runtime/kernels/elementwise.h), with the CPU backend's semantics (runtime/cpu/elementwise.cpp):
// integers wrap, integer division truncates and a division by zero throws (a device flag read
// back after the loop, which synchronises: integer division only), maximum/minimum propagate
// NaN, 16-bit floats compute in f32. The op is a runtime switch inside one kernel per dtype;
// contiguous operands (or a single broadcast element) take the vectorized loop (launch_map).
#include <cmath>

#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/elementwise.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::cuda {
namespace {

template <class T>
inline constexpr bool kIsInt = std::is_integral_v<T> && !std::is_same_v<T, bool>;

constexpr bool is_predicate(BinaryOp op) { return op >= BinaryOp::Eq; }

// Which (op, dtype) pairs exist (the CPU's binary_supported).
bool binary_supported(BinaryOp op, DType t) {
  if (op == BinaryOp::Pow) return is_floating(t);
  if (is_predicate(op)) return true;
  return t != DType::Bool;
}

template <class C>
__device__ inline bool predicate(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::Eq:
      return a == b;
    case BinaryOp::Ne:
      return a != b;
    case BinaryOp::Lt:
      return a < b;
    case BinaryOp::Le:
      return a <= b;
    case BinaryOp::Gt:
      return a > b;
    case BinaryOp::Ge:
      return a >= b;
    case BinaryOp::LogicalAnd:
      return a != C(0) && b != C(0);
    default:
      return a != C(0) || b != C(0);  // LogicalOr
  }
}

// a op b for the arithmetic ops in the compute type C; integer division by zero sets *div0.
template <class C>
__device__ inline C arithmetic(BinaryOp op, C a, C b, int* div0) {
  if constexpr (kIsInt<C>) {
    using U = std::make_unsigned_t<C>;
    switch (op) {
      case BinaryOp::Add:
        return C(U(a) + U(b));
      case BinaryOp::Sub:
        return C(U(a) - U(b));
      case BinaryOp::Mul:
        return C(U(a) * U(b));
      case BinaryOp::Div:
        if (b == 0) {
          *div0 = 1;
          return 0;
        }
        return b == -1 ? C(U(0) - U(a)) : C(a / b);  // avoids INT_MIN / -1
      case BinaryOp::Maximum:
        return a > b ? a : b;
      case BinaryOp::Minimum:
        return a < b ? a : b;
      default:
        return 0;  // Pow: rejected on the host
    }
  } else {
    switch (op) {
      case BinaryOp::Add:
        return a + b;
      case BinaryOp::Sub:
        return a - b;
      case BinaryOp::Mul:
        return a * b;
      case BinaryOp::Div:
        return a / b;
      case BinaryOp::Maximum:
        return (a > b || a != a) ? a : b;  // NaN propagates
      case BinaryOp::Minimum:
        return (a < b || a != a) ? a : b;
      default:  // Pow
        if constexpr (std::is_same_v<C, float>)
          return powf(a, b);
        else
          return ::pow(a, b);
    }
  }
}

// A flag on the device for integer division by zero; check() reads it back (synchronises).
struct DivByZero {
  Tensor flag;
  explicit DivByZero(bool needed) {
    if (needed)
      flag = zeros(
          {1}, TensorOptions{}.with_dtype(DType::I32).with_device(Device::cuda(current_device())));
  }
  int* ptr() const { return flag.defined() ? cuda::ptr<int>(flag) : nullptr; }
  void check() const {
    MT_CHECK(!flag.defined() || flag.item<int>() == 0, "div: integer division by zero");
  }
};

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&a, &b, &out})
    check_on_current_device(*t, "binary");
  MT_CHECK(binary_supported(op, a.dtype()), "binary op ", int(op), ": not supported for ",
           dtype_name(a.dtype()));
  const DivByZero div0(op == BinaryOp::Div && is_integral(a.dtype()));
  int* flag = div0.ptr();
  MT_CUDA_DISPATCH_ALL(a.dtype(), "binary", T, [&] {
    using C = acc_t<T>;
    if (is_predicate(op)) {
      launch_map<bool, T, T>(
          out, [=] __device__(T x, T y) { return predicate(op, C(x), C(y)); }, a, b);
      return;
    }
    if constexpr (!std::is_same_v<T, bool>) {
      launch_map<T, T, T>(
          out, [=] __device__(T x, T y) { return convert<T>(arithmetic(op, C(x), C(y), flag)); },
          a, b);
    }
  });
  div0.check();
}

// A double scalar in T's compute type (the CPU's scalar_as).
template <class T>
acc_t<T> scalar_as(double s) {
  if constexpr (std::is_same_v<T, bool>) {
    return s != 0.0;
  } else if constexpr (kIsInt<T>) {
    MT_CHECK(s >= double(std::numeric_limits<T>::min()) &&
                 s <= double(std::numeric_limits<T>::max()) && s == std::trunc(s),
             "scalar ", s, " is not representable in ", dtype_name(dtype_v<T>));
    return T(s);
  } else {
    return acc_t<T>(s);
  }
}

void binary_scalar(BinaryOp op, const Tensor& a, double scalar, const Tensor& out) {
  check_on_current_device(a, "binary_scalar");
  check_on_current_device(out, "binary_scalar");
  MT_CHECK(binary_supported(op, a.dtype()), "binary op ", int(op), ": not supported for ",
           dtype_name(a.dtype()));
  const DivByZero div0(op == BinaryOp::Div && is_integral(a.dtype()) && scalar == 0.0);
  int* flag = div0.ptr();
  MT_CUDA_DISPATCH_ALL(a.dtype(), "binary_scalar", T, [&] {
    using C = acc_t<T>;
    const C s = scalar_as<T>(scalar);
    if (is_predicate(op)) {
      launch_map<bool, T>(out, [=] __device__(T x) { return predicate(op, C(x), s); }, a);
      return;
    }
    if constexpr (!std::is_same_v<T, bool>) {
      if (op == BinaryOp::Pow && s == C(2)) {  // as the CPU: x * x, not pow(x, 2)
        launch_map<T, T>(
            out,
            [] __device__(T x) {
              const C v = C(x);
              return convert<T>(C(v * v));
            },
            a);
        return;
      }
      launch_map<T, T>(
          out, [=] __device__(T x) { return convert<T>(arithmetic(op, C(x), s, flag)); }, a);
    }
  });
  div0.check();
}

// a + s * b for a non-bool T (integers wrap).
template <class T>
__device__ inline T add_scaled_one(T a, acc_t<T> s, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    return T(U(a) + U(s) * U(b));
  } else {
    using C = acc_t<T>;
    return convert<T>(C(C(a) + s * C(b)));
  }
}

void add_scaled(const Tensor& a, const Tensor& b, double alpha, const Tensor& out) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&a, &b, &out})
    check_on_current_device(*t, "add_");
  MT_CHECK(a.dtype() != DType::Bool, "add_: not supported for bool tensors");
  MT_CUDA_DISPATCH_ALL(a.dtype(), "add_", T, [&] {
    if constexpr (!std::is_same_v<T, bool>) {
      const acc_t<T> s = scalar_as<T>(alpha);
      launch_map<T, T, T>(
          out, [=] __device__(T x, T y) { return add_scaled_one(x, s, y); }, a, b);
    }
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&cond, &a, &b, &out})
    check_on_current_device(*t, "where");
  MT_CHECK(cond.dtype() == DType::Bool, "where: expected a bool condition, got ",
           dtype_name(cond.dtype()));
  MT_CUDA_DISPATCH_ALL(a.dtype(), "where", T, [&] {
    launch_map<T, bool, T, T>(
        out, [] __device__(bool c, T x, T y) { return c ? x : y; }, cond, a, b);
  });
}

MT_REGISTER_KERNEL(binary_kernel, DeviceType::CUDA, binary);
MT_REGISTER_KERNEL(binary_scalar_kernel, DeviceType::CUDA, binary_scalar);
MT_REGISTER_KERNEL(add_scaled_kernel, DeviceType::CUDA, add_scaled);
MT_REGISTER_KERNEL(where_kernel, DeviceType::CUDA, where);

}  // namespace
}  // namespace mt::runtime::cuda
