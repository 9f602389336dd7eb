// CUDA kernels of the fused optimizer updates (runtime/kernels/optim.h): one pass per parameter,
// one thread per element, the CPU kernels' arithmetic (runtime/kernels/optim_update.h).
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/optim.h"
#include "runtime/kernels/optim_update.h"

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
    const auto c = AdamWCoefficients<S>::make(lr, beta1, beta2, eps, weight_decay, step);
    launch_linear(param.numel(), [=] __device__(int64_t i) {
      S pi = S(p[i]);
      adamw_update(S(g[i]), pi, m[i], v[i], c);
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
    const auto c =
        SgdCoefficients<S>::make(lr, momentum, dampening, weight_decay, nesterov, first_step);
    launch_linear(param.numel(), [=] __device__(int64_t i) {
      p[i] = P(sgd_update(S(g[i]), S(p[i]), buf != nullptr ? buf + i : nullptr, c));
    });
  });
}

MT_REGISTER_KERNEL(adamw_step_kernel, DeviceType::CUDA, adamw_step);
MT_REGISTER_KERNEL(sgd_step_kernel, DeviceType::CUDA, sgd_step);

}  // namespace
}  // namespace mt::runtime::cuda
