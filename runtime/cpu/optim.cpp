// CPU kernels of the fused optimizer updates (runtime/kernels/optim.h).
#include "runtime/kernels/optim.h"

#include <cmath>
#include <type_traits>

#include "runtime/cpu/loops.h"

namespace mt::runtime::cpu {

namespace {

constexpr int64_t kOptimGrain = 16384;

template <class P>
using state_t = std::conditional_t<std::is_same_v<P, double>, double, float>;

void cpu_adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int64_t step) {
  check_optimizer_operands("adamw_step", param, grad, {&exp_avg, &exp_avg_sq});
  MT_CHECK(step >= 1, "adamw_step: step must be >= 1, got ", step);
  dispatch_floating(param.dtype(), "adamw_step", [&](auto tag) {
    using P = decltype(tag);
    using S = state_t<P>;
    P* p = param.data<P>();
    const P* g = grad.data<P>();
    S* m = exp_avg.data<S>();
    S* v = exp_avg_sq.data<S>();
    const S decay = S(1.0 - lr * weight_decay);
    const S w1 = S(1.0 - beta1), b2 = S(beta2), w2 = S(1.0 - beta2);
    const S step_size = S(lr / (1.0 - std::pow(beta1, double(step))));
    const S bc2_sqrt = S(std::sqrt(1.0 - std::pow(beta2, double(step))));
    const S e = S(eps);
    parallel_for(param.numel(), kOptimGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const S gi = S(g[i]);
        S pi = S(p[i]) * decay;
        const S mi = m[i] + w1 * (gi - m[i]);
        const S vi = b2 * v[i] + w2 * gi * gi;
        pi -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + e);
        m[i] = mi;
        v[i] = vi;
        p[i] = P(pi);
      }
    });
  });
}

void cpu_sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr,
                  double momentum, double dampening, double weight_decay, bool nesterov,
                  bool first_step) {
  const bool use_momentum = momentum != 0.0;
  MT_CHECK(use_momentum == momentum_buffer.defined(),
           "sgd_step: a momentum buffer is needed exactly when momentum != 0");
  if (use_momentum) {
    check_optimizer_operands("sgd_step", param, grad, {&momentum_buffer});
  } else {
    check_optimizer_operands("sgd_step", param, grad, {});
  }
  dispatch_floating(param.dtype(), "sgd_step", [&](auto tag) {
    using P = decltype(tag);
    using S = state_t<P>;
    P* p = param.data<P>();
    const P* g = grad.data<P>();
    S* buf = use_momentum ? momentum_buffer.data<S>() : nullptr;
    const S wd = S(weight_decay), mom = S(momentum), damp = S(1.0 - dampening), step = S(lr);
    parallel_for(param.numel(), kOptimGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const S pi = S(p[i]);
        S d = S(g[i]);
        if (wd != S(0)) d += wd * pi;
        if (buf != nullptr) {
          const S b = first_step ? d : mom * buf[i] + damp * d;
          buf[i] = b;
          d = nesterov ? d + mom * b : b;
        }
        p[i] = P(pi - step * d);
      }
    });
  });
}

}  // namespace

MT_REGISTER_KERNEL(adamw_step_kernel, DeviceType::CPU, cpu_adamw_step);
MT_REGISTER_KERNEL(sgd_step_kernel, DeviceType::CPU, cpu_sgd_step);

}  // namespace mt::runtime::cpu
