// Elementwise ops: unary math, binary arithmetic with numpy broadcasting, comparisons, where,
// clamp, and in-place updates. Binary ops require both operands to have the same dtype (an
// error names the op, both shapes and dtypes); 16-bit floats compute in f32.
// Differentiable: the arithmetic and math ops, where (w.r.t. a and b), clamp, maximum/minimum.
// Not differentiable: comparisons, logical ops, and every in-place op (name ending in `_`).
// Integers: + - * wrap on overflow, div truncates toward zero and throws on division by zero; a
// scalar operand must be representable in an integer tensor's dtype (comparisons excepted).
#pragma once

#include <optional>

#include "runtime/core/tensor.h"

namespace mt::runtime {

enum class UnaryOp : uint8_t {
  Neg, Exp, Log, Sqrt, Rsqrt, Abs, Sin, Cos, Tanh, Sigmoid, Relu, Silu, Square, Reciprocal,
  LogicalNot
};
enum class BinaryOp : uint8_t {
  Add, Sub, Mul, Div, Maximum, Minimum, Pow, Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr
};

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor square(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);

// Comparisons and logic return bool tensors.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
Tensor logical_not(const Tensor& x);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);

// cond ? a : b, broadcasting all three; cond is bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);

// Generic entry points (what the named functions call).
Tensor unary(UnaryOp op, const Tensor& x);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);

// In place, not recorded by autograd (throw if `self` requires grad while grad mode is on).
// `other` broadcasts to self's shape.
const Tensor& add_(const Tensor& self, const Tensor& other, double alpha = 1.0);  // self += alpha*other
const Tensor& sub_(const Tensor& self, const Tensor& other);
const Tensor& mul_(const Tensor& self, const Tensor& other);
const Tensor& div_(const Tensor& self, const Tensor& other);
const Tensor& add_(const Tensor& self, double value);
const Tensor& mul_(const Tensor& self, double value);
const Tensor& clamp_(const Tensor& self, std::optional<double> min, std::optional<double> max);

inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }

}  // namespace mt::runtime
