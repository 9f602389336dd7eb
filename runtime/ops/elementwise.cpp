// Elementwise ops: validation, output allocation, kernel calls (runtime/kernels/elementwise.h)
// and backward formulas written with runtime ops. Gradients of broadcast operands are reduced
// with sum_to.
#include "runtime/ops/elementwise.h"

#include <cmath>
#include <limits>

#include "runtime/autograd/function.h"
#include "runtime/core/grad_mode.h"
#include "runtime/kernels/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"

namespace mt::runtime {

namespace {

using autograd::BackwardArgs;
using autograd::SavedTensor;

const char* unary_name(UnaryOp op) {
  static constexpr const char* kNames[] = {"neg",  "exp",  "log",    "sqrt",       "rsqrt",
                                           "abs",  "sin",  "cos",    "tanh",       "sigmoid",
                                           "relu", "silu", "square", "reciprocal", "logical_not"};
  return kNames[int(op)];
}

const char* binary_name(BinaryOp op) {
  static constexpr const char* kNames[] = {"add",     "sub", "mul", "div",         "maximum",
                                           "minimum", "pow", "eq",  "ne",          "lt",
                                           "le",      "gt",  "ge",  "logical_and", "logical_or"};
  return kNames[int(op)];
}

bool is_predicate(BinaryOp op) { return op >= BinaryOp::Eq; }
bool is_differentiable(BinaryOp op) { return !is_predicate(op); }

// Which dtypes an op accepts; throws naming the op, the dtype and the shape.
void check_unary_dtype(UnaryOp op, const Tensor& x) {
  const char* name = unary_name(op);
  switch (op) {
    case UnaryOp::LogicalNot:
      return;
    case UnaryOp::Neg:
    case UnaryOp::Abs:
    case UnaryOp::Square:
    case UnaryOp::Relu:
      MT_CHECK(x.dtype() != DType::Bool, name, ": not supported for bool tensors (shape ",
               x.shape(), ")");
      return;
    default:
      MT_CHECK(x.is_floating_point(), name,
               ": expected a floating dtype (f32, f64, bf16, f16), got ", x.dtype(), " (shape ",
               x.shape(), ")");
  }
}

void check_binary_dtype(BinaryOp op, DType t, const Shape& shape) {
  const char* name = binary_name(op);
  if (op == BinaryOp::Pow) {
    MT_CHECK(is_floating(t), name, ": expected a floating dtype (f32, f64, bf16, f16), got ", t,
             " (shape ", shape, ")");
  } else if (!is_predicate(op)) {
    MT_CHECK(t != DType::Bool, name, ": not supported for bool tensors (shape ", shape,
             "); use logical_and / logical_or");
  }
}

void check_same_dtype_device(const char* name, const Tensor& a, const Tensor& b) {
  MT_CHECK(a.dtype() == b.dtype(), name, ": expected operands of the same dtype, got shape ",
           a.shape(), " ", a.dtype(), " and shape ", b.shape(), " ", b.dtype(),
           " (convert one with .to(dtype))");
  MT_CHECK(a.device() == b.device(), name, ": expected operands on the same device, got shape ",
           a.shape(), " on ", a.device(), " and shape ", b.shape(), " on ", b.device());
}

// Whether `s` is exactly representable in the (non-floating) dtype t.
bool scalar_fits(double s, DType t) {
  switch (t) {
    case DType::Bool:
      return s == 0.0 || s == 1.0;
    case DType::I32:
      return s == std::trunc(s) && s >= double(std::numeric_limits<int32_t>::min()) &&
             s <= double(std::numeric_limits<int32_t>::max());
    case DType::I64:  // 2^63 is not an int64
      return s == std::trunc(s) && s >= -9223372036854775808.0 && s < 9223372036854775808.0;
    default:
      return true;
  }
}

void check_scalar_fits(const char* name, double s, const Tensor& t) {
  MT_CHECK(scalar_fits(s, t.dtype()), name, ": scalar ", s, " is not representable in ", t.dtype(),
           " (tensor of shape ", t.shape(), "); convert the tensor with .to(dtype)");
}

Tensor zero_of(const Tensor& like) { return scalar_tensor(0.0, like.options()); }

// g where mask, 0 elsewhere.
Tensor masked(const Tensor& mask, const Tensor& g) { return where(mask, g, zero_of(g)); }

// 1 - t
Tensor one_minus(const Tensor& t) { return add(neg(t), 1.0); }

// d/dx of op at x (output y), times g.
Tensor unary_backward(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y) {
  switch (op) {
    case UnaryOp::Neg:
      return neg(g);
    case UnaryOp::Exp:
      return mul(g, y);
    case UnaryOp::Log:
      return div(g, x);
    case UnaryOp::Sqrt:
      return div(g, mul(y, 2.0));
    case UnaryOp::Rsqrt:
      return mul(mul(g, mul(square(y), y)), -0.5);
    case UnaryOp::Abs:
      return where(gt(x, 0.0), g, masked(lt(x, 0.0), neg(g)));
    case UnaryOp::Sin:
      return mul(g, cos(x));
    case UnaryOp::Cos:
      return neg(mul(g, sin(x)));
    case UnaryOp::Tanh:
      return mul(g, one_minus(square(y)));
    case UnaryOp::Sigmoid:
      return mul(mul(g, y), one_minus(y));
    case UnaryOp::Relu:
      return masked(gt(x, 0.0), g);
    case UnaryOp::Silu: {
      const Tensor s = sigmoid(x);
      return mul(mul(g, s), add(mul(x, one_minus(s)), 1.0));
    }
    case UnaryOp::Square:
      return mul(mul(g, x), 2.0);
    case UnaryOp::Reciprocal:
      return neg(mul(g, square(y)));
    case UnaryOp::LogicalNot:
      break;
  }
  MT_FAIL(unary_name(op), ": not differentiable");
}

bool unary_backward_needs_input(UnaryOp op) {
  switch (op) {
    case UnaryOp::Log:
    case UnaryOp::Abs:
    case UnaryOp::Sin:
    case UnaryOp::Cos:
    case UnaryOp::Relu:
    case UnaryOp::Silu:
    case UnaryOp::Square:
      return true;
    default:
      return false;
  }
}

bool unary_backward_needs_output(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp:
    case UnaryOp::Sqrt:
    case UnaryOp::Rsqrt:
    case UnaryOp::Tanh:
    case UnaryOp::Sigmoid:
    case UnaryOp::Reciprocal:
      return true;
    default:
      return false;
  }
}

// Gradient of maximum/minimum for one operand: g where it wins, g/2 where tied, 0 elsewhere.
Tensor extremum_grad(const Tensor& wins, const Tensor& ties, const Tensor& g) {
  return where(wins, g, masked(ties, mul(g, 0.5)));
}

void record_binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_name(op);
  const bool need_a = GradMode::enabled() && a.requires_grad();
  const bool need_b = GradMode::enabled() && b.requires_grad();
  const Shape sa_shape = a.shape(), sb_shape = b.shape();
  autograd::BackwardFn fn;
  switch (op) {
    case BinaryOp::Add:
    case BinaryOp::Sub:
      fn = [op, sa_shape, sb_shape](const BackwardArgs& args) -> std::vector<Tensor> {
        const Tensor& g = args.grad(0);
        Tensor gb;
        if (args.needs(1)) {
          gb = sum_to(g, sb_shape);
          if (op == BinaryOp::Sub) gb = neg(gb);
        }
        return {args.needs(0) ? sum_to(g, sa_shape) : Tensor(), gb};
      };
      break;
    case BinaryOp::Mul:
      fn = [sa_shape, sb_shape, sa = need_b ? SavedTensor(a) : SavedTensor(),
            sb = need_a ? SavedTensor(b)
                        : SavedTensor()](const BackwardArgs& args) -> std::vector<Tensor> {
        const Tensor& g = args.grad(0);
        return {args.needs(0) ? sum_to(mul(g, sb.get()), sa_shape) : Tensor(),
                args.needs(1) ? sum_to(mul(g, sa.get()), sb_shape) : Tensor()};
      };
      break;
    case BinaryOp::Div:
      fn = [sa_shape, sb_shape, sa = need_b ? SavedTensor(a) : SavedTensor(),
            sb = SavedTensor(b)](const BackwardArgs& args) -> std::vector<Tensor> {
        const Tensor t = div(args.grad(0), sb.get());  // g / b
        return {args.needs(0) ? sum_to(t, sa_shape) : Tensor(),
                args.needs(1) ? sum_to(neg(div(mul(t, sa.get()), sb.get())), sb_shape) : Tensor()};
      };
      break;
    case BinaryOp::Maximum:
    case BinaryOp::Minimum:
      fn = [op, sa_shape, sb_shape, sa = SavedTensor(a),
            sb = SavedTensor(b)](const BackwardArgs& args) -> std::vector<Tensor> {
        const Tensor& g = args.grad(0);
        const Tensor &a = sa.get(), &b = sb.get();
        const Tensor ties = eq(a, b);
        const bool is_max = op == BinaryOp::Maximum;
        Tensor ga, gb;
        if (args.needs(0))
          ga = sum_to(extremum_grad(is_max ? gt(a, b) : lt(a, b), ties, g), sa_shape);
        if (args.needs(1))
          gb = sum_to(extremum_grad(is_max ? lt(a, b) : gt(a, b), ties, g), sb_shape);
        return {ga, gb};
      };
      break;
    case BinaryOp::Pow:
      fn = [sa_shape, sb_shape, sa = SavedTensor(a), sb = SavedTensor(b),
            sout = need_b ? SavedTensor(out)
                          : SavedTensor()](const BackwardArgs& args) -> std::vector<Tensor> {
        const Tensor& g = args.grad(0);
        const Tensor &a = sa.get(), &b = sb.get();
        Tensor ga, gb;
        // d/da a^b = b a^(b-1); 0 where b == 0 (a^0 is constant; at a == 0 the formula is
        // 0 * inf), as PyTorch does.
        if (args.needs(0)) {
          const Tensor d = where(eq(b, 0.0), zero_of(g), mul(b, pow(a, sub(b, 1.0))));
          ga = sum_to(mul(g, d), sa_shape);
        }
        if (args.needs(1)) {
          // d/db a^b = a^b log(a); 0 where a == 0 and b >= 0 (the limit), as PyTorch does.
          const Tensor d =
              where(logical_and(eq(a, 0.0), ge(b, 0.0)), zero_of(g), mul(sout.get(), log(a)));
          gb = sum_to(mul(g, d), sb_shape);
        }
        return {ga, gb};
      };
      break;
    default:
      MT_FAIL(name, ": not differentiable");
  }
  autograd::record(name, {a, b}, {out}, std::move(fn));
}

// out = op(a, scalar) with its backward (for the arithmetic ops).
Tensor binary_scalar(BinaryOp op, const Tensor& a, double s) {
  const char* name = binary_name(op);
  check_binary_dtype(op, a.dtype(), a.shape());
  if (!a.is_floating_point() && !scalar_fits(s, a.dtype())) {
    // e.g. lt(i64 tensor, 2.5): compare exactly in f64 rather than rounding the scalar.
    if (is_predicate(op)) return binary_scalar(op, a.to(DType::F64), s);
    check_scalar_fits(name, s, a);
  }
  const DType out_dtype = is_predicate(op) ? DType::Bool : a.dtype();
  Tensor out = Tensor::empty(a.shape(), TensorOptions{out_dtype, a.device()});
  binary_scalar_kernel(a.device(), op, a, s, out);
  if (is_differentiable(op) && autograd::any_requires_grad({a})) {
    autograd::record(name, {a}, {out},
                     [op, s, sa = op == BinaryOp::Pow ? SavedTensor(a) : SavedTensor()](
                         const BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& g = args.grad(0);
                       switch (op) {
                         case BinaryOp::Add:
                         case BinaryOp::Sub:
                           return {g};
                         case BinaryOp::Mul:
                           return {mul(g, s)};
                         case BinaryOp::Div:
                           return {div(g, s)};
                         case BinaryOp::Pow:
                           if (s == 0.0) return {zeros_like(g)};
                           if (s == 1.0) return {g};
                           if (s == 2.0) return {mul(mul(g, sa.get()), 2.0)};
                           return {mul(mul(g, pow(sa.get(), s - 1.0)), s)};
                         default:
                           MT_FAIL(binary_name(op), ": not differentiable");
                       }
                     });
  }
  return out;
}

// Validation shared by the in-place ops: no autograd, and self must not overlap itself.
void check_inplace_self(const char* name, const Tensor& self) {
  MT_CHECK(!(GradMode::enabled() && self.requires_grad()), name,
           ": in-place update of a tensor that requires grad (shape ", self.shape(),
           ") while grad mode is on; use the out-of-place op, or run under NoGradGuard");
  for (int64_t d = 0; d < self.dim(); ++d)
    MT_CHECK(self.stride(d) != 0 || self.size(d) <= 1, name, ": self (shape ", self.shape(),
             ", strides ", self.strides(),
             ") has overlapping memory (an expanded view); clone it first");
}

// `other` for an in-place op on self: same dtype/device, broadcasts to self's shape; copied when
// it shares memory with self in a different layout (reading it while writing self would be wrong).
Tensor inplace_other(const char* name, const Tensor& self, const Tensor& other) {
  check_same_dtype_device(name, self, other);
  const Shape shape = broadcast_shapes(self.shape(), other.shape(), name);
  MT_CHECK(shape == self.shape(), name, ": other of shape ", other.shape(),
           " does not broadcast to self's shape ", self.shape());
  const bool same_layout = other.shape() == self.shape() && other.strides() == self.strides() &&
                           other.offset() == self.offset();
  if (other.shares_storage_with(self) && !same_layout) {
    NoGradGuard no_grad;
    return other.clone();
  }
  return other;
}

const Tensor& inplace_binary(BinaryOp op, const Tensor& self, const Tensor& other) {
  const char* name = op == BinaryOp::Add   ? "add_"
                     : op == BinaryOp::Sub ? "sub_"
                     : op == BinaryOp::Mul ? "mul_"
                                           : "div_";
  check_inplace_self(name, self);
  check_binary_dtype(op, self.dtype(), self.shape());
  const Tensor o = inplace_other(name, self, other);
  binary_kernel(self.device(), op, self, o, self);
  self.bump_version();
  return self;
}

const Tensor& inplace_scalar(const char* name, BinaryOp op, const Tensor& self, double value) {
  check_inplace_self(name, self);
  check_binary_dtype(op, self.dtype(), self.shape());
  check_scalar_fits(name, value, self);
  binary_scalar_kernel(self.device(), op, self, value, self);
  self.bump_version();
  return self;
}

std::pair<double, double> clamp_bounds(const char* name, std::optional<double> min,
                                       std::optional<double> max) {
  MT_CHECK(min.has_value() || max.has_value(), name, ": at least one of min and max is needed");
  const double inf = std::numeric_limits<double>::infinity();
  return {min.value_or(-inf), max.value_or(inf)};
}

}  // namespace

// ---- unary -------------------------------------------------------------------------------------

Tensor unary(UnaryOp op, const Tensor& x) {
  check_unary_dtype(op, x);
  const DType out_dtype = op == UnaryOp::LogicalNot ? DType::Bool : x.dtype();
  Tensor out = Tensor::empty(x.shape(), TensorOptions{out_dtype, x.device()});
  unary_kernel(x.device(), op, x, out);
  if (op != UnaryOp::LogicalNot && autograd::any_requires_grad({x})) {
    autograd::record(unary_name(op), {x}, {out},
                     [op, sx = unary_backward_needs_input(op) ? SavedTensor(x) : SavedTensor(),
                      sy = unary_backward_needs_output(op) ? SavedTensor(out) : SavedTensor()](
                         const BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor none;
                       return {unary_backward(op, args.grad(0), sx.defined() ? sx.get() : none,
                                              sy.defined() ? sy.get() : none)};
                     });
  }
  return out;
}

Tensor neg(const Tensor& x) { return unary(UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) { return unary(UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return unary(UnaryOp::Sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary(UnaryOp::Rsqrt, x); }
Tensor abs(const Tensor& x) { return unary(UnaryOp::Abs, x); }
Tensor sin(const Tensor& x) { return unary(UnaryOp::Sin, x); }
Tensor cos(const Tensor& x) { return unary(UnaryOp::Cos, x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::Tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::Sigmoid, x); }
Tensor relu(const Tensor& x) { return unary(UnaryOp::Relu, x); }
Tensor silu(const Tensor& x) { return unary(UnaryOp::Silu, x); }
Tensor square(const Tensor& x) { return unary(UnaryOp::Square, x); }
Tensor reciprocal(const Tensor& x) { return unary(UnaryOp::Reciprocal, x); }
Tensor logical_not(const Tensor& x) { return unary(UnaryOp::LogicalNot, x); }
Tensor pow(const Tensor& x, double exponent) { return binary_scalar(BinaryOp::Pow, x, exponent); }

// ---- binary ------------------------------------------------------------------------------------

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_same_dtype_device(name, a, b);
  check_binary_dtype(op, a.dtype(), a.shape());
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  const DType out_dtype = is_predicate(op) ? DType::Bool : a.dtype();
  Tensor out = Tensor::empty(shape, TensorOptions{out_dtype, a.device()});
  binary_kernel(a.device(), op, a, b, out);
  if (is_differentiable(op) && autograd::any_requires_grad({a, b})) record_binary(op, a, b, out);
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Minimum, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Pow, a, b); }
Tensor add(const Tensor& a, double b) { return binary_scalar(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, double b) { return binary_scalar(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, double b) { return binary_scalar(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, double b) { return binary_scalar(BinaryOp::Div, a, b); }

Tensor eq(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Ge, a, b); }
Tensor eq(const Tensor& a, double b) { return binary_scalar(BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, double b) { return binary_scalar(BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, double b) { return binary_scalar(BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, double b) { return binary_scalar(BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, double b) { return binary_scalar(BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, double b) { return binary_scalar(BinaryOp::Ge, a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return binary(BinaryOp::LogicalAnd, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return binary(BinaryOp::LogicalOr, a, b); }

// ---- where, clamp ------------------------------------------------------------------------------

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  MT_CHECK(cond.dtype() == DType::Bool, "where: expected a bool condition, got ", cond.dtype(),
           " (shape ", cond.shape(), ")");
  check_same_dtype_device("where", a, b);
  MT_CHECK(cond.device() == a.device(), "where: condition on ", cond.device(), ", values on ",
           a.device());
  const Shape shape =
      broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  Tensor out = Tensor::empty(shape, TensorOptions{a.dtype(), a.device()});
  where_kernel(a.device(), cond, a, b, out);
  if (autograd::any_requires_grad({a, b})) {
    autograd::record("where", {a, b}, {out},
                     [sc = SavedTensor(cond), sa_shape = a.shape(),
                      sb_shape = b.shape()](const BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& g = args.grad(0);
                       const Tensor& c = sc.get();
                       const Tensor zero = zero_of(g);
                       return {args.needs(0) ? sum_to(where(c, g, zero), sa_shape) : Tensor(),
                               args.needs(1) ? sum_to(where(c, zero, g), sb_shape) : Tensor()};
                     });
  }
  return out;
}

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  const auto [lo, hi] = clamp_bounds("clamp", min, max);
  MT_CHECK(x.dtype() != DType::Bool, "clamp: not supported for bool tensors (shape ", x.shape(),
           ")");
  Tensor out = Tensor::empty(x.shape(), TensorOptions{x.dtype(), x.device()});
  clamp_kernel(x.device(), x, lo, hi, out);
  if (autograd::any_requires_grad({x})) {
    autograd::record(
        "clamp", {x}, {out},
        [sx = SavedTensor(x), min, max](const BackwardArgs& args) -> std::vector<Tensor> {
          // The gradient passes where min <= x <= max.
          const Tensor& x = sx.get();
          Tensor mask;
          if (min) mask = ge(x, *min);
          if (max) mask = mask.defined() ? logical_and(mask, le(x, *max)) : le(x, *max);
          return {masked(mask, args.grad(0))};
        });
  }
  return out;
}

// ---- in place ----------------------------------------------------------------------------------

const Tensor& add_(const Tensor& self, const Tensor& other, double alpha) {
  if (alpha == 1.0) return inplace_binary(BinaryOp::Add, self, other);
  check_inplace_self("add_", self);
  check_binary_dtype(BinaryOp::Add, self.dtype(), self.shape());
  check_scalar_fits("add_", alpha, self);
  const Tensor o = inplace_other("add_", self, other);
  add_scaled_kernel(self.device(), self, o, alpha, self);
  self.bump_version();
  return self;
}
const Tensor& sub_(const Tensor& self, const Tensor& other) {
  return inplace_binary(BinaryOp::Sub, self, other);
}
const Tensor& mul_(const Tensor& self, const Tensor& other) {
  return inplace_binary(BinaryOp::Mul, self, other);
}
const Tensor& div_(const Tensor& self, const Tensor& other) {
  return inplace_binary(BinaryOp::Div, self, other);
}
const Tensor& add_(const Tensor& self, double value) {
  return inplace_scalar("add_", BinaryOp::Add, self, value);
}
const Tensor& mul_(const Tensor& self, double value) {
  return inplace_scalar("mul_", BinaryOp::Mul, self, value);
}
const Tensor& clamp_(const Tensor& self, std::optional<double> min, std::optional<double> max) {
  const auto [lo, hi] = clamp_bounds("clamp_", min, max);
  check_inplace_self("clamp_", self);
  MT_CHECK(self.dtype() != DType::Bool, "clamp_: not supported for bool tensors (shape ",
           self.shape(), ")");
  clamp_kernel(self.device(), self, lo, hi, self);
  self.bump_version();
  return self;
}

}  // namespace mt::runtime
