// CUDA kernels of the binary elementwise ops, their scalar forms, add_ with alpha and where
// (runtime/kernels/elementwise.h), with the CPU backend's semantics (runtime/cpu/elementwise.cpp):
// integers wrap, integer division truncates and a division by zero throws (a device flag read
// back after the loop, which synchronises: integer division only), maximum/minimum propagate
// NaN, 16-bit floats compute in f32. The op is a runtime switch inside one kernel per dtype.
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

// The (element) strides of `t` broadcast to out's shape.
Shape strides_in(const Tensor& t, const Tensor& out) {
  return broadcast_strides(t.shape(), t.strides(), out.shape());
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&a, &b, &out})
    check_on_current_device(*t, "binary");
  MT_CHECK(binary_supported(op, a.dtype()), "binary op ", int(op), ": not supported for ",
           dtype_name(a.dtype()));
  const std::array<Shape, 3> strides{out.strides(), strides_in(a, out), strides_in(b, out)};
  const DivByZero div0(op == BinaryOp::Div && is_integral(a.dtype()));
  int* flag = div0.ptr();
  MT_CUDA_DISPATCH_ALL(a.dtype(), "binary", T, [&] {
    using C = acc_t<T>;
    const T* ap = ptr<T>(a);
    const T* bp = ptr<T>(b);
    if (is_predicate(op)) {
      bool* o = ptr<bool>(out);
      launch_elementwise<3>(out.shape(), strides, [=] __device__(const int64_t* off) {
        o[off[0]] = predicate(op, C(ap[off[1]]), C(bp[off[2]]));
      });
      return;
    }
    if constexpr (!std::is_same_v<T, bool>) {
      T* o = ptr<T>(out);
      launch_elementwise<3>(out.shape(), strides, [=] __device__(const int64_t* off) {
        o[off[0]] = convert<T>(arithmetic(op, C(ap[off[1]]), C(bp[off[2]]), flag));
      });
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
  const std::array<Shape, 2> strides{out.strides(), strides_in(a, out)};
  const DivByZero div0(op == BinaryOp::Div && is_integral(a.dtype()) && scalar == 0.0);
  int* flag = div0.ptr();
  MT_CUDA_DISPATCH_ALL(a.dtype(), "binary_scalar", T, [&] {
    using C = acc_t<T>;
    const C s = scalar_as<T>(scalar);
    const T* ap = ptr<T>(a);
    if (is_predicate(op)) {
      bool* o = ptr<bool>(out);
      launch_elementwise<2>(out.shape(), strides, [=] __device__(const int64_t* off) {
        o[off[0]] = predicate(op, C(ap[off[1]]), s);
      });
      return;
    }
    if constexpr (!std::is_same_v<T, bool>) {
      T* o = ptr<T>(out);
      if (op == BinaryOp::Pow && s == C(2)) {  // as the CPU: x * x, not pow(x, 2)
        launch_elementwise<2>(out.shape(), strides, [=] __device__(const int64_t* off) {
          const C v = C(ap[off[1]]);
          o[off[0]] = convert<T>(C(v * v));
        });
        return;
      }
      launch_elementwise<2>(out.shape(), strides, [=] __device__(const int64_t* off) {
        o[off[0]] = convert<T>(arithmetic(op, C(ap[off[1]]), s, flag));
      });
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
  const std::array<Shape, 3> strides{out.strides(), strides_in(a, out), strides_in(b, out)};
  MT_CUDA_DISPATCH_ALL(a.dtype(), "add_", T, [&] {
    if constexpr (!std::is_same_v<T, bool>) {
      using C = acc_t<T>;
      const C s = scalar_as<T>(alpha);
      const T* ap = ptr<T>(a);
      const T* bp = ptr<T>(b);
      T* o = ptr<T>(out);
      launch_elementwise<3>(out.shape(), strides, [=] __device__(const int64_t* off) {
        o[off[0]] = add_scaled_one(ap[off[1]], s, bp[off[2]]);
      });
    }
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&cond, &a, &b, &out})
    check_on_current_device(*t, "where");
  MT_CHECK(cond.dtype() == DType::Bool, "where: expected a bool condition, got ",
           dtype_name(cond.dtype()));
  const std::array<Shape, 4> strides{out.strides(), strides_in(cond, out), strides_in(a, out),
                                     strides_in(b, out)};
  MT_CUDA_DISPATCH_ALL(a.dtype(), "where", T, [&] {
    const bool* cp = ptr<bool>(cond);
    const T* ap = ptr<T>(a);
    const T* bp = ptr<T>(b);
    T* o = ptr<T>(out);
    launch_elementwise<4>(out.shape(), strides, [=] __device__(const int64_t* off) {
      o[off[0]] = cp[off[1]] ? ap[off[2]] : bp[off[3]];
    });
  });
}

MT_REGISTER_KERNEL(binary_kernel, DeviceType::CUDA, binary);
MT_REGISTER_KERNEL(binary_scalar_kernel, DeviceType::CUDA, binary_scalar);
MT_REGISTER_KERNEL(add_scaled_kernel, DeviceType::CUDA, add_scaled);
MT_REGISTER_KERNEL(where_kernel, DeviceType::CUDA, where);

}  // namespace
}  // namespace mt::runtime::cuda
