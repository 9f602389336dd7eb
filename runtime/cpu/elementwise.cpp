// CPU kernels of the elementwise family. Every kernel is a strided map over out's shape
// (cpu::strided_loop): operands are broadcast through stride-0 dims, runs that are contiguous in
// every operand become plain pointer loops the compiler vectorises, and a stride-0 operand in a
// run is hoisted into a register. Each element is computed by exactly one thread, so results do
// not depend on the thread count.
#include "runtime/kernels/elementwise.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/cpu/loops.h"
#include "runtime/cpu/vec_math.h"

namespace mt::runtime::cpu {
namespace {

template <class T>
inline constexpr bool kIsInt = std::is_integral_v<T> && !std::is_same_v<T, bool>;
template <class T>
inline constexpr bool kIsFloat = std::is_floating_point_v<compute_t<T>>;

// Integer arithmetic wraps (two's complement) instead of overflowing (undefined behaviour).
template <class T>
T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(a) + U(b));
}
template <class T>
T wrap_sub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(a) - U(b));
}
template <class T>
T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(a) * U(b));
}
template <class T>
T wrap_neg(T a) {
  using U = std::make_unsigned_t<T>;
  return T(U(0) - U(a));
}

// ---- loops -------------------------------------------------------------------------------------

// True when every operand is contiguous with out's shape: the fast path is then one flat loop,
// split over threads (strided_loop would see a single run and keep it on one thread).
template <class... Ts>
bool all_dense(const Tensor& out, const Ts&... in) {
  return out.is_contiguous() && ((in.shape() == out.shape() && in.is_contiguous()) && ...);
}

template <class Out, class A, class F>
void map1(const Tensor& out, const Tensor& a, F f) {
  const Shape& shape = out.shape();
  Out* po = static_cast<Out*>(out.data_ptr());
  const A* pa = static_cast<const A*>(a.data_ptr());
  if (all_dense(out, a)) {
    parallel_for(out.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) po[j] = f(pa[j]);
    });
    return;
  }
  strided_loop<2>(shape, {out.strides(), broadcast_strides(a.shape(), a.strides(), shape)},
                  [&](const auto& off, int64_t n, const auto& st) {
                    Out* o = po + off[0];
                    const A* x = pa + off[1];
                    if (st[0] == 1 && st[1] == 1) {
                      for (int64_t j = 0; j < n; ++j) o[j] = f(x[j]);
                    } else {
                      for (int64_t j = 0; j < n; ++j) o[j * st[0]] = f(x[j * st[1]]);
                    }
                  });
}

template <class Out, class A, class B, class F>
void map2(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  const Shape& shape = out.shape();
  Out* po = static_cast<Out*>(out.data_ptr());
  const A* pa = static_cast<const A*>(a.data_ptr());
  const B* pb = static_cast<const B*>(b.data_ptr());
  if (all_dense(out, a, b)) {
    parallel_for(out.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) po[j] = f(pa[j], pb[j]);
    });
    return;
  }
  strided_loop<3>(shape,
                  {out.strides(), broadcast_strides(a.shape(), a.strides(), shape),
                   broadcast_strides(b.shape(), b.strides(), shape)},
                  [&](const auto& off, int64_t n, const auto& st) {
                    Out* o = po + off[0];
                    const A* x = pa + off[1];
                    const B* y = pb + off[2];
                    if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
                      for (int64_t j = 0; j < n; ++j) o[j] = f(x[j], y[j]);
                    } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
                      const B yv = *y;
                      for (int64_t j = 0; j < n; ++j) o[j] = f(x[j], yv);
                    } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
                      const A xv = *x;
                      for (int64_t j = 0; j < n; ++j) o[j] = f(xv, y[j]);
                    } else {
                      for (int64_t j = 0; j < n; ++j) o[j * st[0]] = f(x[j * st[1]], y[j * st[2]]);
                    }
                  });
}

template <class Out, class A, class B, class C, class F>
void map3(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, F f) {
  const Shape& shape = out.shape();
  Out* po = static_cast<Out*>(out.data_ptr());
  const A* pa = static_cast<const A*>(a.data_ptr());
  const B* pb = static_cast<const B*>(b.data_ptr());
  const C* pc = static_cast<const C*>(c.data_ptr());
  if (all_dense(out, a, b, c)) {
    parallel_for(out.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) po[j] = f(pa[j], pb[j], pc[j]);
    });
    return;
  }
  strided_loop<4>(shape,
                  {out.strides(), broadcast_strides(a.shape(), a.strides(), shape),
                   broadcast_strides(b.shape(), b.strides(), shape),
                   broadcast_strides(c.shape(), c.strides(), shape)},
                  [&](const auto& off, int64_t n, const auto& st) {
                    Out* o = po + off[0];
                    const A* x = pa + off[1];
                    const B* y = pb + off[2];
                    const C* z = pc + off[3];
                    if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 1) {
                      for (int64_t j = 0; j < n; ++j) o[j] = f(x[j], y[j], z[j]);
                    } else {
                      for (int64_t j = 0; j < n; ++j)
                        o[j * st[0]] = f(x[j * st[1]], y[j * st[2]], z[j * st[3]]);
                    }
                  });
}

// ---- op definitions ----------------------------------------------------------------------------

constexpr bool is_predicate(BinaryOp op) { return op >= BinaryOp::Eq; }

template <BinaryOp kOp, class T>
constexpr bool binary_supported() {
  if constexpr (kOp == BinaryOp::Pow) return kIsFloat<T>;
  if constexpr (is_predicate(kOp)) return true;
  return !std::is_same_v<T, bool>;
}

// Integer division: truncating; division by zero sets `*div_by_zero` and yields 0.
template <class T>
T int_div(T a, T b, std::atomic<bool>* div_by_zero) {
  if (b == 0) [[unlikely]] {
    div_by_zero->store(true, std::memory_order_relaxed);
    return 0;
  }
  if (b == -1) return wrap_neg(a);  // avoids INT_MIN / -1
  return T(a / b);
}

// The result of `a op b` computed in C (the compute type); predicates return bool.
template <BinaryOp kOp, class C>
inline auto apply_binary(C a, C b, std::atomic<bool>* div_by_zero) {
  if constexpr (kOp == BinaryOp::Add) {
    if constexpr (kIsInt<C>)
      return wrap_add(a, b);
    else
      return C(a + b);
  } else if constexpr (kOp == BinaryOp::Sub) {
    if constexpr (kIsInt<C>)
      return wrap_sub(a, b);
    else
      return C(a - b);
  } else if constexpr (kOp == BinaryOp::Mul) {
    if constexpr (kIsInt<C>)
      return wrap_mul(a, b);
    else
      return C(a * b);
  } else if constexpr (kOp == BinaryOp::Div) {
    if constexpr (kIsInt<C>)
      return int_div(a, b, div_by_zero);
    else
      return C(a / b);
  } else if constexpr (kOp == BinaryOp::Maximum) {
    return (a > b || a != a) ? a : b;  // NaN propagates
  } else if constexpr (kOp == BinaryOp::Minimum) {
    return (a < b || a != a) ? a : b;
  } else if constexpr (kOp == BinaryOp::Pow) {
    return C(std::pow(a, b));
  } else if constexpr (kOp == BinaryOp::Eq) {
    return a == b;
  } else if constexpr (kOp == BinaryOp::Ne) {
    return a != b;
  } else if constexpr (kOp == BinaryOp::Lt) {
    return a < b;
  } else if constexpr (kOp == BinaryOp::Le) {
    return a <= b;
  } else if constexpr (kOp == BinaryOp::Gt) {
    return a > b;
  } else if constexpr (kOp == BinaryOp::Ge) {
    return a >= b;
  } else if constexpr (kOp == BinaryOp::LogicalAnd) {
    return a != C(0) && b != C(0);
  } else {
    static_assert(kOp == BinaryOp::LogicalOr);
    return a != C(0) || b != C(0);
  }
}

template <class Fn>
decltype(auto) dispatch_binary_op(BinaryOp op, Fn&& fn) {
  using B = BinaryOp;
#define MT_BINARY_CASE(name) \
  case B::name:              \
    return fn(std::integral_constant<B, B::name>{})
  switch (op) {
    MT_BINARY_CASE(Add);
    MT_BINARY_CASE(Sub);
    MT_BINARY_CASE(Mul);
    MT_BINARY_CASE(Div);
    MT_BINARY_CASE(Maximum);
    MT_BINARY_CASE(Minimum);
    MT_BINARY_CASE(Pow);
    MT_BINARY_CASE(Eq);
    MT_BINARY_CASE(Ne);
    MT_BINARY_CASE(Lt);
    MT_BINARY_CASE(Le);
    MT_BINARY_CASE(Gt);
    MT_BINARY_CASE(Ge);
    MT_BINARY_CASE(LogicalAnd);
    MT_BINARY_CASE(LogicalOr);
  }
#undef MT_BINARY_CASE
  MT_FAIL("binary: unknown op ", int(op));
}

template <UnaryOp kOp, class T>
constexpr bool unary_supported() {
  if constexpr (kOp == UnaryOp::LogicalNot) return true;
  if constexpr (kOp == UnaryOp::Neg || kOp == UnaryOp::Abs || kOp == UnaryOp::Square ||
                kOp == UnaryOp::Relu)
    return !std::is_same_v<T, bool>;
  return kIsFloat<T>;
}

template <UnaryOp kOp, class C>
inline auto apply_unary(C x) {
  using U = UnaryOp;
  if constexpr (kOp == U::LogicalNot) {
    return x == C(0);
  } else if constexpr (kIsInt<C>) {
    if constexpr (kOp == U::Neg) return wrap_neg(x);
    if constexpr (kOp == U::Abs) return x < 0 ? wrap_neg(x) : x;
    if constexpr (kOp == U::Square) return wrap_mul(x, x);
    if constexpr (kOp == U::Relu) return x < 0 ? C(0) : x;
  } else {
    if constexpr (kOp == U::Neg) return C(-x);
    if constexpr (kOp == U::Exp) return C(std::exp(x));
    if constexpr (kOp == U::Log) return C(std::log(x));
    if constexpr (kOp == U::Sqrt) return C(std::sqrt(x));
    if constexpr (kOp == U::Rsqrt) return C(C(1) / std::sqrt(x));
    if constexpr (kOp == U::Abs) return C(std::abs(x));
    if constexpr (kOp == U::Sin) return C(std::sin(x));
    if constexpr (kOp == U::Cos) return C(std::cos(x));
    if constexpr (kOp == U::Tanh) return C(std::tanh(x));
    if constexpr (kOp == U::Sigmoid) return C(C(1) / (C(1) + std::exp(-x)));
    if constexpr (kOp == U::Relu) return x < C(0) ? C(0) : x;  // NaN stays NaN
    if constexpr (kOp == U::Silu) return C(x / (C(1) + std::exp(-x)));
    if constexpr (kOp == U::Square) return C(x * x);
    if constexpr (kOp == U::Reciprocal) return C(C(1) / x);
  }
}

template <class Fn>
decltype(auto) dispatch_unary_op(UnaryOp op, Fn&& fn) {
  using U = UnaryOp;
#define MT_UNARY_CASE(name) \
  case U::name:             \
    return fn(std::integral_constant<U, U::name>{})
  switch (op) {
    MT_UNARY_CASE(Neg);
    MT_UNARY_CASE(Exp);
    MT_UNARY_CASE(Log);
    MT_UNARY_CASE(Sqrt);
    MT_UNARY_CASE(Rsqrt);
    MT_UNARY_CASE(Abs);
    MT_UNARY_CASE(Sin);
    MT_UNARY_CASE(Cos);
    MT_UNARY_CASE(Tanh);
    MT_UNARY_CASE(Sigmoid);
    MT_UNARY_CASE(Relu);
    MT_UNARY_CASE(Silu);
    MT_UNARY_CASE(Square);
    MT_UNARY_CASE(Reciprocal);
    MT_UNARY_CASE(LogicalNot);
  }
#undef MT_UNARY_CASE
  MT_FAIL("unary: unknown op ", int(op));
}

void check_no_div_by_zero(const std::atomic<bool>& flag) {
  MT_CHECK(!flag.load(), "div: integer division by zero");
}

// A double scalar in T's compute type (bool: nonzero).
template <class T>
compute_t<T> scalar_as(double s) {
  if constexpr (std::is_same_v<T, bool>) {
    return s != 0.0;
  } else if constexpr (kIsInt<T>) {
    MT_CHECK(s >= double(std::numeric_limits<T>::min()) &&
                 s <= double(std::numeric_limits<T>::max()) && s == std::trunc(s),
             "scalar ", s, " is not representable in ", dtype_name(dtype_v<T>));
    return T(s);
  } else {
    return compute_t<T>(s);
  }
}

// ---- kernels -----------------------------------------------------------------------------------

void cpu_unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  dispatch_dtype(x.dtype(), "unary", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    dispatch_unary_op(op, [&](auto op_tag) {
      constexpr UnaryOp kOp = decltype(op_tag)::value;
      if constexpr (unary_supported<kOp, T>()) {
        using Out = std::conditional_t<kOp == UnaryOp::LogicalNot, bool, T>;
        map1<Out, T>(out, x, [](T v) { return Out(apply_unary<kOp>(C(v))); });
      } else {
        MT_FAIL("unary op ", int(kOp), ": not supported for ", dtype_name(dtype_v<T>));
      }
    });
  });
}

// bf16 add, sub, mul and div of dense operands: chunks widened to f32, vec_math's vectorised f32
// op, one rounding per output: the values of the elementwise loop (one f32 op, rounded), several
// times faster (residual adds and gradient sums of bf16 training).
template <BinaryOp kOp>
constexpr char kArithSymbol = kOp == BinaryOp::Add   ? '+'
                              : kOp == BinaryOp::Sub ? '-'
                              : kOp == BinaryOp::Mul ? '*'
                              : kOp == BinaryOp::Div ? '/'
                                                     : 0;

template <BinaryOp kOp>
void dense_bf16_arith(const Tensor& a, const Tensor& b, const Tensor& out) {
  constexpr int64_t kChunk = 512;
  const uint16_t* pa = &a.data<bfloat16>()->bits;
  const uint16_t* pb = &b.data<bfloat16>()->bits;
  uint16_t* po = &out.data<bfloat16>()->bits;
  parallel_for(out.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
    float a32[kChunk], b32[kChunk];
    for (int64_t c = begin; c < end; c += kChunk) {
      const int64_t m = std::min(kChunk, end - c);
      row_bf16_to_f32(pa + c, m, a32);
      row_bf16_to_f32(pb + c, m, b32);
      row_arith(kArithSymbol<kOp>, a32, b32, m, a32);
      row_f32_to_bf16(a32, m, po + c);
    }
  });
}

void cpu_binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  std::atomic<bool> div_by_zero{false};
  dispatch_dtype(a.dtype(), "binary", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    dispatch_binary_op(op, [&](auto op_tag) {
      constexpr BinaryOp kOp = decltype(op_tag)::value;
      if constexpr (binary_supported<kOp, T>()) {
        using Out = std::conditional_t<is_predicate(kOp), bool, T>;
        if constexpr (std::is_same_v<T, bfloat16> && kArithSymbol<kOp> != 0) {
          if (all_dense(out, a, b)) return dense_bf16_arith<kOp>(a, b, out);
        }
        std::atomic<bool>* flag = &div_by_zero;
        map2<Out, T, T>(out, a, b,
                        [flag](T x, T y) { return Out(apply_binary<kOp>(C(x), C(y), flag)); });
      } else {
        MT_FAIL("binary op ", int(kOp), ": not supported for ", dtype_name(dtype_v<T>));
      }
    });
  });
  check_no_div_by_zero(div_by_zero);
}

void cpu_binary_scalar(BinaryOp op, const Tensor& a, double scalar, const Tensor& out) {
  std::atomic<bool> div_by_zero{false};
  dispatch_dtype(a.dtype(), "binary_scalar", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    dispatch_binary_op(op, [&](auto op_tag) {
      constexpr BinaryOp kOp = decltype(op_tag)::value;
      if constexpr (binary_supported<kOp, T>()) {
        using Out = std::conditional_t<is_predicate(kOp), bool, T>;
        const C s = scalar_as<T>(scalar);
        if constexpr (kOp == BinaryOp::Pow) {
          if (s == C(2)) {
            map1<Out, T>(out, a, [](T x) { return Out(C(x) * C(x)); });
            return;
          }
        }
        std::atomic<bool>* flag = &div_by_zero;
        map1<Out, T>(out, a, [s, flag](T x) { return Out(apply_binary<kOp>(C(x), s, flag)); });
      } else {
        MT_FAIL("binary op ", int(kOp), ": not supported for ", dtype_name(dtype_v<T>));
      }
    });
  });
  check_no_div_by_zero(div_by_zero);
}

void cpu_add_scaled(const Tensor& a, const Tensor& b, double alpha, const Tensor& out) {
  dispatch_dtype(a.dtype(), "add_", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      MT_FAIL("add_: not supported for bool tensors");
    } else {
      const C s = scalar_as<T>(alpha);
      if constexpr (kIsInt<T>) {
        map2<T, T, T>(out, a, b, [s](T x, T y) { return wrap_add(x, wrap_mul(s, y)); });
      } else {
        map2<T, T, T>(out, a, b, [s](T x, T y) { return T(C(x) + s * C(y)); });
      }
    }
  });
}

void cpu_where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_dtype(a.dtype(), "where", [&](auto tag) {
    using T = decltype(tag);
    map3<T, bool, T, T>(out, cond, a, b, [](bool c, T x, T y) { return c ? x : y; });
  });
}

// Bounds for clamping integers: the smallest/largest T within [lo, hi].
template <class T>
T int_bound(double v, bool lower) {
  const double r = lower ? std::ceil(v) : std::floor(v);
  if (!(r > double(std::numeric_limits<T>::min()))) return std::numeric_limits<T>::min();
  if (!(r < double(std::numeric_limits<T>::max()))) return std::numeric_limits<T>::max();
  return T(r);
}

void cpu_clamp(const Tensor& x, double lo, double hi, const Tensor& out) {
  dispatch_dtype(x.dtype(), "clamp", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      MT_FAIL("clamp: not supported for bool tensors");
    } else {
      C l, h;
      if constexpr (kIsInt<T>) {
        l = int_bound<T>(lo, true);
        h = int_bound<T>(hi, false);
      } else {
        l = C(lo);
        h = C(hi);
      }
      map1<T, T>(out, x, [l, h](T v) {
        C r = C(v) < l ? l : C(v);  // NaN stays NaN
        r = r > h ? h : r;
        return T(r);
      });
    }
  });
}

}  // namespace

MT_REGISTER_KERNEL(unary_kernel, DeviceType::CPU, cpu_unary);
MT_REGISTER_KERNEL(binary_kernel, DeviceType::CPU, cpu_binary);
MT_REGISTER_KERNEL(binary_scalar_kernel, DeviceType::CPU, cpu_binary_scalar);
MT_REGISTER_KERNEL(add_scaled_kernel, DeviceType::CPU, cpu_add_scaled);
MT_REGISTER_KERNEL(where_kernel, DeviceType::CPU, cpu_where);
MT_REGISTER_KERNEL(clamp_kernel, DeviceType::CPU, cpu_clamp);

}  // namespace mt::runtime::cpu
