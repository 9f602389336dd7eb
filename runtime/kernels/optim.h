// Kernel tables of the fused optimizer updates (the optimizers are in runtime/optim).
//
// Each kernel updates one parameter in place in ONE pass over its elements (parallel over
// elements; every element is independent, so results do not depend on the thread count).
// Contract: param, grad and the state tensors are contiguous with the same shape; grad has the
// param's dtype; state tensors are f32, or f64 when the param is f64. Arithmetic is done in the
// state's dtype (so bf16/f16 params are updated in f32 and rounded once on store); the scalar
// hyper-parameters (bias corrections included) are computed in f64.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// AdamW (Loshchilov & Hutter; torch.optim.AdamW semantics), for step >= 1:
//   p   -= lr * weight_decay * p
//   m    = m + (1 - beta1) * (g - m)
//   v    = beta2 * v + (1 - beta2) * g^2
//   p   -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
inline constinit KernelTable<void(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                  const Tensor& exp_avg_sq, double lr, double beta1, double beta2,
                                  double eps, double weight_decay, int64_t step)>
    adamw_step_kernel{"adamw_step"};

// AdamW over several parameters of one device and dtype, each with its own state and step count,
// in as few launches as the backend can (CUDA: one per kMaxTensorsPerLaunch parameters; the CPU
// runs adamw_step_kernel's arithmetic on each). The same results as adamw_step_kernel per tensor.
// grad_scale (undefined: none) is a one-element f64 tensor on the device: each gradient element
// is used as scaled_grad(g, grad_scale) (optim_update.h), so clipping's scaling costs no pass of
// its own; the gradients are not written.
struct AdamWOperands {
  Tensor param, grad, exp_avg, exp_avg_sq;
  int64_t step = 0;
};
// In a trace (profiler.h): the four tensors of each entry as inputs, the code "A<step>,<step>,..."
// (one step per entry).
template <>
struct TracedArg<std::vector<AdamWOperands>> {
  static void record(int64_t index, const std::vector<AdamWOperands>& list) {
    std::vector<Tensor> tensors;
    std::vector<int64_t> steps;
    for (const AdamWOperands& o : list) {
      tensors.insert(tensors.end(), {o.param, o.grad, o.exp_avg, o.exp_avg_sq});
      steps.push_back(o.step);
    }
    for (const Tensor& t : tensors) Profiler::add_tensor(index, t, false);
    std::string code = kernel_arg_code(steps);  // "L<steps>"
    code[0] = 'A';
    Profiler::add_arg(index, std::move(code));
  }
  static std::vector<AdamWOperands> decode(replay_detail::KernelArgDecoder& d,
                                           const std::string& code) {
    d.expect(!code.empty() && code[0] == 'A', code, "AdamW operands");
    std::vector<AdamWOperands> list;
    for (int64_t step : d.numbers(code.substr(1), code)) {
      AdamWOperands& o = list.emplace_back();
      o.param = d.next_input();
      o.grad = d.next_input();
      o.exp_avg = d.next_input();
      o.exp_avg_sq = d.next_input();
      o.step = step;
    }
    return list;
  }
};
inline constinit KernelTable<void(const std::vector<AdamWOperands>& tensors, double lr,
                                  double beta1, double beta2, double eps, double weight_decay,
                                  const Tensor& grad_scale)>
    adamw_multi_tensor_kernel{"adamw_multi_tensor_step"};

// Gradient clipping over many tensors in a few launches (runtime/optim/clip_grad.h), for
// backends that provide it (CUDA); the optimizer code runs its per-tensor ops elsewhere.
// Tensors are contiguous, floating and on one device; dtypes may differ.
// norm_pow: `out` (0-D f64 on that device) = sum |x|^p over every element (max |x| for p = +inf,
// NaN propagating), accumulated in f64 in an order fixed by the sizes alone (deterministic; it
// differs from a tensor-by-tensor sum, so results agree with the CPU to f64 rounding).
inline constinit KernelTable<void(const std::vector<Tensor>& tensors, double norm_type,
                                  const Tensor& out)>
    norm_pow_multi_tensor_kernel{"norm_pow_multi_tensor"};
// scale: every tensor *= scale (0-D f64 on that device), computed in f32 (f64 for f64 tensors)
// and rounded once: the values of mul_ by the scale converted to f32 (f64).
inline constinit KernelTable<void(const std::vector<Tensor>& tensors, const Tensor& scale)>
    scale_multi_tensor_kernel{"scale_multi_tensor_"};

// SGD (torch.optim.SGD semantics):
//   d = g + weight_decay * p
//   if momentum != 0: buf = first_step ? d : momentum * buf + (1 - dampening) * d
//                     d = nesterov ? d + momentum * buf : buf
//   p -= lr * d
// momentum_buffer is undefined when momentum == 0.
inline constinit KernelTable<void(
    const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr,
    double momentum, double dampening, double weight_decay, bool nesterov, bool first_step)>
    sgd_step_kernel{"sgd_step"};

// Validates a grad_scale (above): undefined, or one f64 element on `device`.
inline void check_grad_scale(const char* op, const Tensor& grad_scale, Device device) {
  MT_CHECK(!grad_scale.defined() || (grad_scale.numel() == 1 && grad_scale.dtype() == DType::F64 &&
                                     grad_scale.device() == device),
           op, ": grad_scale must be one f64 value on ", device);
}

// Validates the contract above for one parameter; `op` names the optimizer in errors.
inline void check_optimizer_operands(const char* op, const Tensor& param, const Tensor& grad,
                                     std::initializer_list<const Tensor*> state) {
  MT_CHECK(param.is_contiguous() && grad.is_contiguous(), op,
           ": param and grad must be contiguous");
  MT_CHECK(grad.shape() == param.shape() && grad.dtype() == param.dtype(), op, ": grad ",
           grad.shape(), " ", grad.dtype(), " does not match param ", param.shape(), " ",
           param.dtype());
  const DType sd = param.dtype() == DType::F64 ? DType::F64 : DType::F32;
  for (const Tensor* s : state) {
    MT_CHECK(s->is_contiguous() && s->shape() == param.shape() && s->dtype() == sd, op,
             ": state tensor ", s->shape(), " ", s->dtype(), " does not match param ",
             param.shape(), " (expected ", sd, ")");
  }
}

}  // namespace mt::runtime
