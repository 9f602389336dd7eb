#include "runtime/autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"

namespace mt::runtime::autograd {

namespace {

double dot(const Tensor& out, const std::vector<double>& v) {
  const std::vector<double> values = out.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < values.size(); ++i) s += values[i] * v[i];
  return s;
}

// Pointer to the logical row-major element `i` of a CPU f64 tensor, through its strides.
double* element(const Tensor& t, int64_t i) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    off += (i % t.shape()[d]) * t.strides()[d];
    i /= t.shape()[d];
  }
  return t.data<double>() + off;
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Each input's gradient (zeros where none arrived) after backpropagating through fn(inputs) the
// upstream gradient `backward` hands the output.
std::vector<std::vector<double>> analytical_gradients(
    const Fn& fn, const std::vector<Tensor>& inputs,
    const std::function<void(const Tensor&)>& backward) {
  for (const Tensor& in : inputs)
    if (in.defined() && in.requires_grad()) in.set_grad(Tensor());
  {
    EnableGradGuard grad;
    backward(fn(inputs));
  }
  std::vector<std::vector<double>> grads(inputs.size());  // empty for inputs without gradients
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& in = inputs[k];
    if (!in.defined() || !in.requires_grad()) continue;
    grads[k] = in.grad().defined() ? in.grad().to_vector<double>()
                                   : std::vector<double>(size_t(in.numel()), 0.0);
  }
  return grads;
}

// An upstream gradient in a layout that real losses hand an op, and the same values contiguous.
struct UpstreamLayout {
  const char* what;
  std::function<void(const Tensor&)> in_layout, contiguous;
};

// Layouts of the output's gradient that autograd hands ops: broadcast (the loss sums or averages
// the output: stride 0), broadcast over every dim but the last, or over the last, and transposed.
std::vector<UpstreamLayout> upstream_layouts(const Tensor& out, uint64_t seed) {
  const Shape& shape = out.shape();
  const int64_t n = out.dim();
  const TensorOptions options = TensorOptions{}.with_dtype(out.dtype());
  const auto random = [&](const Shape& s, const char* name) {
    return randn(s, RandomKey(seed, name), options);
  };
  std::vector<UpstreamLayout> layouts;
  if (out.numel() <= 1) return layouts;
  layouts.push_back({"broadcast (the loss sums the output)",
                     [=](const Tensor& y) { sum(y).backward(full({}, 0.7, options)); },
                     [=](const Tensor& y) { y.backward(full(shape, 0.7, options)); }});
  if (n < 2) return layouts;
  std::vector<int64_t> leading;
  for (int64_t d = 0; d + 1 < n; ++d) leading.push_back(d);
  const Tensor row = random({shape[size_t(n - 1)]}, "gradcheck row");
  layouts.push_back({"broadcast over every dim but the last",
                     [=](const Tensor& y) { sum(y, leading).backward(row); },
                     [=](const Tensor& y) { y.backward(row.expand(shape).contiguous()); }});
  const Tensor column = random(Shape(shape.begin(), shape.end() - 1), "gradcheck column");
  layouts.push_back(
      {"broadcast over the last dim", [=](const Tensor& y) { sum(y, {n - 1}).backward(column); },
       [=](const Tensor& y) { y.backward(column.unsqueeze(-1).expand(shape).contiguous()); }});
  const Tensor swapped = random(out.transpose(0, n - 1).shape(), "gradcheck transposed");
  layouts.push_back(
      {"transposed", [=](const Tensor& y) { y.transpose(0, n - 1).backward(swapped); },
       [=](const Tensor& y) { y.backward(swapped.transpose(0, n - 1).contiguous()); }});
  return layouts;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions options) {
  GradcheckResult result;
  std::ostringstream msg;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& in = inputs[k];
    if (!in.defined() || !in.requires_grad()) continue;
    MT_CHECK(in.dtype() == DType::F64 && in.device().is_cpu(), "gradcheck: input ", k,
             " must be a cpu f64 tensor, got ", in.dtype(), " on ", in.device());
    MT_CHECK(in.is_leaf(), "gradcheck: input ", k, " is not a leaf (its gradient would not be ",
             "stored); make strided inputs leaves, e.g. randn(...).t().set_requires_grad(true)");
    in.set_grad(Tensor());
  }

  // Analytical: backpropagate v through fn.
  Tensor out;
  {
    EnableGradGuard grad;
    out = fn(inputs);
  }
  MT_CHECK(out.requires_grad(), "gradcheck: the function's output does not require grad");
  const Tensor v = randn(out.shape(), RandomKey(options.seed, "gradcheck"),
                         TensorOptions{}.with_dtype(out.dtype()));
  const std::vector<double> v_host = v.to_vector<double>();
  out.backward(v);

  int mismatches = 0;
  NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& in = inputs[k];
    if (!in.defined() || !in.requires_grad()) continue;
    const Tensor g = in.grad();
    const std::vector<double> analytical =
        g.defined() ? g.to_vector<double>() : std::vector<double>(size_t(in.numel()), 0.0);
    for (int64_t i = 0; i < in.numel(); ++i) {
      double* p = element(in, i);
      const double orig = *p;
      *p = orig + options.eps;
      const double plus = dot(fn(inputs), v_host);
      *p = orig - options.eps;
      const double minus = dot(fn(inputs), v_host);
      *p = orig;
      const double numerical = (plus - minus) / (2 * options.eps);
      const double a = analytical[size_t(i)];
      if (!(std::abs(a - numerical) <= options.atol + options.rtol * std::abs(numerical))) {
        result.ok = false;
        if (++mismatches <= 8)
          msg << "input " << k << " (shape " << in.shape() << ") element " << i
              << ": analytical " << a << " vs numerical " << numerical << "\n";
      }
    }
  }
  if (mismatches > 8) msg << "... " << mismatches << " mismatches in all\n";

  // Backward is linear in the upstream gradient, and the contiguous case is checked above: other
  // layouts of the same values must give the same gradients (kernels that read a gradient's
  // strides as a dense layout fail here).
  if (options.check_upstream_layouts) {
    std::vector<Tensor> first_grads;
    for (const Tensor& in : inputs)
      if (in.defined() && in.requires_grad()) first_grads.push_back(in.grad());
    for (const UpstreamLayout& layout : upstream_layouts(out, options.seed)) {
      const auto got = analytical_gradients(fn, inputs, layout.in_layout);
      const auto want = analytical_gradients(fn, inputs, layout.contiguous);
      int wrong = 0;
      for (size_t k = 0; k < got.size(); ++k)
        for (size_t i = 0; i < got[k].size(); ++i) {
          const double a = got[k][i], b = want[k][i];
          if (std::abs(a - b) <= options.atol + options.rtol * std::abs(b)) continue;
          result.ok = false;
          if (++wrong <= 4)
            msg << "upstream gradient " << layout.what << ": input " << k << " element " << i
                << ": " << a << " vs " << b << " from the same values contiguous\n";
        }
    }
    size_t j = 0;  // the gradients of the finite-difference check, for callers that read them
    for (const Tensor& in : inputs)
      if (in.defined() && in.requires_grad()) in.set_grad(first_grads[j++]);
  }
  result.message = msg.str();
  return result;
}

}  // namespace mt::runtime::autograd
