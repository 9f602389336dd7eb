// CUDA kernels of the fused optimizer updates (runtime/kernels/optim.h): one pass per parameter,
// one thread per element, the same arithmetic as the CPU kernels (state in f32, or f64).
#include <cmath>

#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/optim.h"

namespace mt::runtime::cuda {
namespace {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
                double weight_decay, int64_t step) {
  check_optimizer_operands("adamw_step", param, grad, {&exp_avg, &exp_avg_sq});
  check_on_current_device(param, "adamw_step");
  MT_CHECK(step >= 1, "adamw_step: step must be >= 1, got ", step);
  MT_CUDA_DISPATCH_FLOATING(param.dtype(), "adamw_step", P, [&] {
    using S = std::conditional_t<std::is_same_v<P, double>, double, float>;
    P* p = ptr<P>(param);
    const P* g = ptr<P>(grad);
    S* m = ptr<S>(exp_avg);
    S* v = ptr<S>(exp_avg_sq);
    const S decay = S(1.0 - lr * weight_decay);
    const S w1 = S(1.0 - beta1), b2 = S(beta2), w2 = S(1.0 - beta2);
    const S step_size = S(lr / (1.0 - std::pow(beta1, double(step))));
    const S bc2_sqrt = S(std::sqrt(1.0 - std::pow(beta2, double(step))));
    const S e = S(eps);
    launch_linear(param.numel(), [=] __device__(int64_t i) {
      const S gi = S(g[i]);
      S pi = S(p[i]) * decay;
      const S mi = m[i] + w1 * (gi - m[i]);
      const S vi = b2 * v[i] + w2 * gi * gi;
      pi -= step_size * mi / (sqrt(vi) / bc2_sqrt + e);
      m[i] = mi;
      v[i] = vi;
      p[i] = P(pi);
    });
  });
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr,
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
  check_on_current_device(param, "sgd_step");
  MT_CUDA_DISPATCH_FLOATING(param.dtype(), "sgd_step", P, [&] {
    using S = std::conditional_t<std::is_same_v<P, double>, double, float>;
    P* p = ptr<P>(param);
    const P* g = ptr<P>(grad);
    S* buf = use_momentum ? ptr<S>(momentum_buffer) : nullptr;
    const S wd = S(weight_decay), mom = S(momentum), damp = S(1.0 - dampening), lr_s = S(lr);
    launch_linear(param.numel(), [=] __device__(int64_t i) {
      const S pi = S(p[i]);
      S d = S(g[i]);
      if (wd != S(0)) d += wd * pi;
      if (buf != nullptr) {
        const S b = first_step ? d : mom * buf[i] + damp * d;
        buf[i] = b;
        d = nesterov ? d + mom * b : b;
      }
      p[i] = P(pi - lr_s * d);
    });
  });
}

MT_REGISTER_KERNEL(adamw_step_kernel, DeviceType::CUDA, adamw_step);
MT_REGISTER_KERNEL(sgd_step_kernel, DeviceType::CUDA, sgd_step);

}  // namespace
}  // namespace mt::runtime::cuda
