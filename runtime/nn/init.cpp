#include "runtime/nn/init.h"

#include <cmath>
#include <limits>
#include <vector>

#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::nn {

namespace {

using Block = InitBlockScope::Block;
thread_local InitBlockScope* t_active_scope = nullptr;
thread_local bool t_deferred_init = false;

// A parameter registered under DeferredInitGuard (no memory): its values come later.
bool deferred(const Tensor& t) { return t_deferred_init && !t.storage()->has_memory(); }

Block resolve_block(const Tensor& t, const Shape& given_full_shape, const Shape& given_offset,
                    const char* op) {
  MT_CHECK(t.defined(), op, ": undefined tensor");
  MT_CHECK(t.is_floating_point(), op, ": expected a floating tensor, got ", t.dtype());
  const Block* scoped = InitBlockScope::find(t);
  const Shape& full_shape = scoped != nullptr ? scoped->full_shape : given_full_shape;
  const Shape& block_offset = scoped != nullptr ? scoped->offset : given_offset;
  if (full_shape.empty() && block_offset.empty()) return {t.shape(), Shape(t.shape().size(), 0)};
  Shape offset = block_offset.empty() ? Shape(full_shape.size(), 0) : block_offset;
  MT_CHECK(full_shape.size() == size_t(t.dim()) && offset.size() == full_shape.size(), op,
           ": block of shape ", t.shape(), " with offset ", offset, " in a tensor of shape ",
           full_shape, ": ranks differ");
  for (size_t d = 0; d < full_shape.size(); ++d) {
    MT_CHECK(offset[d] >= 0 && offset[d] + t.shape()[d] <= full_shape[d], op, ": block of shape ",
             t.shape(), " at offset ", offset, " exceeds the full shape ", full_shape);
  }
  return {full_shape, offset};
}

// Runs fill(host tensor) on t itself on the host, or on a host copy then copied to t's device.
template <class Fill>
void fill_on_host(const Tensor& t, Fill fill) {
  NoGradGuard no_grad;
  if (t.device().is_cpu()) {
    fill(t);
    return;
  }
  const Tensor host = Tensor::empty(t.shape(), TensorOptions{}.with_dtype(t.dtype()));
  fill(host);
  t.copy_(host);
}

}  // namespace

DeferredInitGuard::DeferredInitGuard() : previous_(t_deferred_init) { t_deferred_init = true; }
DeferredInitGuard::~DeferredInitGuard() { t_deferred_init = previous_; }
bool DeferredInitGuard::active() { return t_deferred_init; }

InitBlockScope::InitBlockScope() {
  MT_CHECK(t_active_scope == nullptr, "InitBlockScope: scopes do not nest");
  t_active_scope = this;
}
InitBlockScope::~InitBlockScope() { t_active_scope = nullptr; }

void InitBlockScope::add(const Tensor& t, Shape full_shape, Shape block_offset) {
  blocks_[t.storage().get()] = {std::move(full_shape), std::move(block_offset)};
}

const InitBlockScope::Block* InitBlockScope::find(const Tensor& t) {
  if (t_active_scope == nullptr) return nullptr;
  const auto it = t_active_scope->blocks_.find(t.storage().get());
  return it == t_active_scope->blocks_.end() ? nullptr : &it->second;
}

void init_normal_(const Tensor& t, const RandomKey& key, double mean, double std,
                  const Shape& full_shape, const Shape& block_offset) {
  MT_CHECK(std >= 0, "init_normal_: std must be >= 0, got ", std);
  if (deferred(t)) return;
  const Block b = resolve_block(t, full_shape, block_offset, "init_normal_");
  fill_on_host(t, [&](const Tensor& h) {
    fill_normal_slice(h, b.full_shape, b.offset, key, mean, std);
  });
}

void init_uniform_(const Tensor& t, const RandomKey& key, double low, double high,
                   const Shape& full_shape, const Shape& block_offset) {
  MT_CHECK(low <= high, "init_uniform_: expected low <= high, got [", low, ", ", high, ")");
  if (deferred(t)) return;
  const Block b = resolve_block(t, full_shape, block_offset, "init_uniform_");
  fill_on_host(t, [&](const Tensor& h) {
    fill_uniform_slice(h, b.full_shape, b.offset, key, low, high);
  });
}

double erfinv(double y) {
  if (std::isnan(y) || y < -1.0 || y > 1.0) return std::numeric_limits<double>::quiet_NaN();
  if (y == 1.0) return std::numeric_limits<double>::infinity();
  if (y == -1.0) return -std::numeric_limits<double>::infinity();
  // Giles' single-precision approximation, then Newton steps on erf(x) - y.
  const double w0 = -std::log((1.0 - y) * (1.0 + y));
  double x;
  if (w0 < 5.0) {
    const double w = w0 - 2.5;
    double p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
    x = p * y;
  } else {
    const double w = std::sqrt(w0) - 3.0;
    double p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
    x = p * y;
  }
  const double two_over_sqrt_pi = 1.1283791670955126;
  for (int i = 0; i < 3; ++i) {
    const double err = std::erf(x) - y;
    const double deriv = two_over_sqrt_pi * std::exp(-x * x);
    if (deriv == 0.0) break;
    x -= err / deriv;
  }
  return x;
}

void init_trunc_normal_(const Tensor& t, const RandomKey& key, double mean, double std, double a,
                        double b, const Shape& full_shape, const Shape& block_offset) {
  MT_CHECK(std > 0, "init_trunc_normal_: std must be > 0, got ", std);
  MT_CHECK(a < b, "init_trunc_normal_: expected a < b, got [", a, ", ", b, "]");
  if (deferred(t)) return;
  const Block blk = resolve_block(t, full_shape, block_offset, "init_trunc_normal_");
  auto norm_cdf = [](double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); };
  const double lo = 2.0 * norm_cdf((a - mean) / std) - 1.0;
  const double hi = 2.0 * norm_cdf((b - mean) / std) - 1.0;

  fill_on_host(t, [&](const Tensor& h) {
    fill_slice_by_index(h, blk.full_shape, blk.offset, "init_trunc_normal_", [&](uint64_t i) {
      const double x = erfinv(lo + (hi - lo) * uniform_at(key, i)) * std * std::sqrt(2.0) + mean;
      return std::min(std::max(x, a), b);
    });
  });
}

void init_constant_(const Tensor& t, double value) {
  MT_CHECK(t.defined(), "init_constant_: undefined tensor");
  if (deferred(t)) return;
  NoGradGuard no_grad;
  t.fill_(value);
}

}  // namespace mt::runtime::nn
