#include "runtime/optim/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/kernels/optim.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"

namespace mt::runtime::optim {

namespace {
bool is_inf_norm(double p) { return std::isinf(p) && p > 0; }

void check_norm_type(const char* op, double p) {
  MT_CHECK(is_inf_norm(p) || (std::isfinite(p) && p > 0), op,
           ": norm_type must be > 0 or +inf, got ", p);
}

// 0-D f64 tensor on the grad's device: sum |g|^p, or max |g| for +inf.
Tensor grad_norm_pow(const Tensor& grad, double p) {
  const Tensor g = grad.to(DType::F64);
  if (is_inf_norm(p)) return max(abs(g));
  if (p == 2.0) return sum(square(g));
  if (p == 1.0) return sum(abs(g));
  return sum(pow(abs(g), p));
}

// The gradients of `params` that count (defined, nonempty), grouped by device in order of first
// appearance.
std::vector<std::vector<Tensor>> grads_by_device(const std::vector<Tensor>& params,
                                                 const char* op) {
  std::vector<std::vector<Tensor>> groups;
  for (const Tensor& param : params) {
    if (!param.defined()) continue;
    const Tensor grad = param.grad();
    if (!grad.defined() || grad.numel() == 0) continue;
    MT_CHECK(grad.is_floating_point(), op, ": gradient of parameter '", param.name(),
             "' has dtype ", dtype_name(grad.dtype()), ", expected a floating dtype");
    size_t k = 0;
    while (k < groups.size() && groups[k].front().device() != grad.device()) ++k;
    if (k == groups.size()) groups.emplace_back();
    groups[k].push_back(grad);
  }
  return groups;
}

// Whether the device's backend has the multi-tensor kernel and every tensor suits it.
template <class Table>
bool fused(const Table& kernel, const std::vector<Tensor>& grads) {
  if (!kernel.has(grads.front().device().type)) return false;
  for (const Tensor& g : grads)
    if (!g.is_contiguous()) return false;
  return true;
}

// sum |g|^p (max |g|) over grads of one device, a 0-D f64 tensor on it.
Tensor device_norm_pow(const std::vector<Tensor>& grads, double p) {
  if (fused(norm_pow_multi_tensor_kernel, grads)) {
    Tensor out = scalar_tensor(0.0, grads.front().options().with_dtype(DType::F64));
    norm_pow_multi_tensor_kernel(out.device(), grads, p, out);
    return out;
  }
  Tensor acc;  // tensor by tensor, in order
  for (const Tensor& grad : grads) {
    const Tensor part = grad_norm_pow(grad, p);
    acc = !acc.defined() ? part : is_inf_norm(p) ? maximum(acc, part) : add(acc, part);
  }
  return acc;
}
}  // namespace

Tensor local_norm_pow_tensor(const std::vector<Tensor>& params, double norm_type) {
  check_norm_type("local_norm_pow", norm_type);
  NoGradGuard no_grad;
  // Partials stay on the device of the first gradient and are combined in device order.
  Tensor acc;
  for (const std::vector<Tensor>& grads : grads_by_device(params, "local_norm_pow")) {
    Tensor part = device_norm_pow(grads, norm_type);
    if (!acc.defined()) {
      acc = part;
      continue;
    }
    part = part.to(acc.device());
    acc = is_inf_norm(norm_type) ? maximum(acc, part) : add(acc, part);
  }
  return acc.defined() ? acc : scalar_tensor(0.0, TensorOptions{}.with_dtype(DType::F64));
}

double local_norm_pow(const std::vector<Tensor>& params, double norm_type) {
  return local_norm_pow_tensor(params, norm_type).item<double>();  // the one host sync
}

double combine_norm_pows(std::span<const double> partials, double norm_type) {
  check_norm_type("combine_norm_pows", norm_type);
  double out = 0.0;
  for (double v : partials) {
    if (std::isnan(v)) return v;  // NaN propagates (std::max would drop it)
    out = is_inf_norm(norm_type) ? std::max(out, v) : out + v;
  }
  return out;
}

Tensor norm_from_pow(const Tensor& partial, double norm_type) {
  check_norm_type("norm_from_pow", norm_type);
  NoGradGuard no_grad;
  if (is_inf_norm(norm_type) || norm_type == 1.0) return partial;
  if (norm_type == 2.0) return sqrt(partial);
  return pow(partial, 1.0 / norm_type);
}

double norm_from_pow(double partial, double norm_type) {
  check_norm_type("norm_from_pow", norm_type);
  if (is_inf_norm(norm_type) || norm_type == 1.0) return partial;
  if (norm_type == 2.0) return std::sqrt(partial);
  return std::pow(partial, 1.0 / norm_type);
}

double total_grad_norm(const std::vector<Tensor>& params, double norm_type) {
  return norm_from_pow(local_norm_pow(params, norm_type), norm_type);
}

double clip_grads_with_norm_(const std::vector<Tensor>& params, double max_norm,
                             double total_norm) {
  MT_CHECK(std::isfinite(max_norm) && max_norm >= 0,
           "clip_grads_with_norm_: max_norm must be a "
           "finite value >= 0, got ",
           max_norm);
  if (!(total_norm > max_norm)) return 1.0;  // also NaN: never scale by NaN
  const double coef = max_norm / (total_norm + 1e-6);
  NoGradGuard no_grad;
  for (const Tensor& param : params) {
    if (!param.defined()) continue;
    const Tensor grad = param.grad();
    if (grad.defined() && grad.numel() > 0) mul_(grad, coef);
  }
  return coef;
}

Tensor clip_coefficient(const Tensor& total_norm, double max_norm) {
  MT_CHECK(std::isfinite(max_norm) && max_norm >= 0,
           "clip_coefficient: max_norm must be a finite value >= 0, got ", max_norm);
  MT_CHECK(total_norm.defined() && total_norm.numel() == 1 && total_norm.dtype() == DType::F64,
           "clip_coefficient: expected the total norm as one f64 value");
  NoGradGuard no_grad;
  // The coefficient the host path uses, computed where the norm is: max_norm / (total + 1e-6)
  // when total > max_norm (never for NaN), else 1 (multiplying by 1 changes no value).
  const Tensor total = total_norm.reshape({});
  const Tensor max_t = scalar_tensor(max_norm, total.options());
  return where(gt(total, max_norm), div(max_t, add(total, 1e-6)),
               scalar_tensor(1.0, total.options()));
}

Tensor scaled_by(const Tensor& grad, const Tensor& coef) {
  NoGradGuard no_grad;
  if (grad.dtype() == DType::F64) return mul(grad, coef.to(DType::F64));
  return mul(grad.to(DType::F32), coef.to(DType::F32)).to(grad.dtype());
}

void clip_grads_with_norm_(const std::vector<Tensor>& params, double max_norm,
                           const Tensor& total_norm) {
  const Tensor coef = clip_coefficient(total_norm, max_norm);
  NoGradGuard no_grad;
  for (const std::vector<Tensor>& grads : grads_by_device(params, "clip_grads_with_norm_")) {
    const Tensor c = coef.to(grads.front().device());
    if (fused(scale_multi_tensor_kernel, grads)) {
      scale_multi_tensor_kernel(c.device(), grads, c);
      continue;
    }
    const Tensor c32 = c.to(DType::F32);
    for (const Tensor& grad : grads) {
      if (grad.dtype() == DType::F32) {
        mul_(grad, c32);  // in place: no new tensor
      } else {
        grad.copy_(scaled_by(grad, c));
      }
    }
  }
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  MT_CHECK(std::isfinite(max_norm) && max_norm >= 0,
           "clip_grad_norm_: max_norm must be a finite "
           "value >= 0, got ",
           max_norm);
  const double total = total_grad_norm(params, norm_type);
  MT_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm_: the total norm of order ",
           norm_type, " of the gradients is ", total,
           " (non-finite), so the gradients cannot be clipped; set error_if_nonfinite=false to "
           "skip this check");
  clip_grads_with_norm_(params, max_norm, total);
  return total;
}

}  // namespace mt::runtime::optim
