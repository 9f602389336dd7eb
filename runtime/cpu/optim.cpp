// CPU kernels of the fused optimizer updates (runtime/kernels/optim.h).
#include "runtime/kernels/optim.h"

#include <optional>
#include <type_traits>

#include "runtime/cpu/loops.h"
#include "runtime/cpu/vec_math.h"
#include "runtime/kernels/optim_update.h"

namespace mt::runtime::cpu {

namespace {

constexpr int64_t kOptimGrain = 16384;

template <class P>
using state_t = std::conditional_t<std::is_same_v<P, double>, double, float>;

// grad_scale: see adamw_multi_tensor_kernel (nullopt: none).
void adamw_step_scaled(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                       const Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int64_t step, std::optional<double> grad_scale) {
  check_optimizer_operands("adamw_step", param, grad, {&exp_avg, &exp_avg_sq});
  MT_CHECK(step >= 1, "adamw_step: step must be >= 1, got ", step);
  dispatch_floating(param.dtype(), "adamw_step", [&](auto tag) {
    using P = decltype(tag);
    using S = state_t<P>;
    P* p = param.data<P>();
    const P* g = grad.data<P>();
    S* m = exp_avg.data<S>();
    S* v = exp_avg_sq.data<S>();
    const auto c = AdamWCoefficients<S>::make(lr, beta1, beta2, eps, weight_decay, step);
    const S scale = S(grad_scale.value_or(1.0));
    parallel_for(param.numel(), kOptimGrain, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<P, float>) {  // vectorised
        row_adamw(p + begin, g + begin, m + begin, v + begin, end - begin, c, scale);
        return;
      } else if constexpr (std::is_same_v<P, bfloat16>) {
        row_adamw(&p[begin].bits, &g[begin].bits, m + begin, v + begin, end - begin, c, scale);
        return;
      }
      for (int64_t i = begin; i < end; ++i) {
        S pi = S(p[i]);
        adamw_update(grad_scale ? scaled_grad(g[i], scale) : S(g[i]), pi, m[i], v[i], c);
        p[i] = P(pi);
      }
    });
  });
}

void cpu_adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int64_t step) {
  adamw_step_scaled(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step,
                    std::nullopt);
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
    const auto c =
        SgdCoefficients<S>::make(lr, momentum, dampening, weight_decay, nesterov, first_step);
    parallel_for(param.numel(), kOptimGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        p[i] = P(sgd_update(S(g[i]), S(p[i]), buf != nullptr ? buf + i : nullptr, c));
      }
    });
  });
}

// One pass per tensor: on the CPU a launch costs nothing, so the multi-tensor form is a loop.
void cpu_adamw_multi_tensor_step(const std::vector<AdamWOperands>& tensors, double lr, double beta1,
                                 double beta2, double eps, double weight_decay,
                                 const Tensor& grad_scale) {
  if (tensors.empty()) return;
  check_grad_scale("adamw_multi_tensor_step", grad_scale, tensors.front().param.device());
  std::optional<double> scale;
  if (grad_scale.defined()) scale = grad_scale.item<double>();
  for (const AdamWOperands& t : tensors) {
    adamw_step_scaled(t.param, t.grad, t.exp_avg, t.exp_avg_sq, lr, beta1, beta2, eps, weight_decay,
                      t.step, scale);
  }
}

}  // namespace

MT_REGISTER_KERNEL(adamw_step_kernel, DeviceType::CPU, cpu_adamw_step);
MT_REGISTER_KERNEL(adamw_multi_tensor_kernel, DeviceType::CPU, cpu_adamw_multi_tensor_step);
MT_REGISTER_KERNEL(sgd_step_kernel, DeviceType::CPU, cpu_sgd_step);

}  // namespace mt::runtime::cpu
