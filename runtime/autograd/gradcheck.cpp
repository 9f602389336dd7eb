#include "runtime/autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"

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
  result.message = msg.str();
  return result;
}

}  // namespace mt::runtime::autograd
