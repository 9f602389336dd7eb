// CUDA kernels of the fused optimizer updates (runtime/kernels/optim.h): one pass per parameter
// (one thread per element) or one launch per 48 parameters (multi-tensor AdamW), with the CPU
// kernels' arithmetic (runtime/kernels/optim_update.h).
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

// Multi-tensor AdamW (apex's multi_tensor_apply idea): up to kMaxTensors parameters per launch,
// their pointers, sizes and coefficients in the kernel's parameter space (__grid_constant__, so
// indexing them by tensor does not copy the table to local memory); each block updates
// kBlockElems elements of one tensor, found from the cumulative block counts.
constexpr int kMaxTensors = 48;
constexpr int64_t kBlockElems = 4 * kThreads;

template <class P, class S>
struct AdamWLaunch {
  P* p[kMaxTensors];
  const P* g[kMaxTensors];
  S* m[kMaxTensors];
  S* v[kMaxTensors];
  int64_t numel[kMaxTensors];
  int64_t blocks_end[kMaxTensors];  // cumulative block count through tensor t
  AdamWCoefficients<S> c[kMaxTensors];
  int count = 0;
};

template <class P, class S>
__global__ void adamw_multi_tensor_kernel_impl(const __grid_constant__ AdamWLaunch<P, S> a) {
  const int64_t b = blockIdx.x;
  int t = 0;
  while (t + 1 < a.count && b >= a.blocks_end[t]) ++t;
  const int64_t start = (b - (t == 0 ? 0 : a.blocks_end[t - 1])) * kBlockElems;
  const int64_t end = start + kBlockElems < a.numel[t] ? start + kBlockElems : a.numel[t];
  P* p = a.p[t];
  const P* g = a.g[t];
  S* m = a.m[t];
  S* v = a.v[t];
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
    S pi = S(p[i]);
    adamw_update(S(g[i]), pi, m[i], v[i], a.c[t]);
    p[i] = P(pi);
  }
}

void adamw_multi_tensor_step(const std::vector<AdamWOperands>& tensors, double lr, double beta1,
                             double beta2, double eps, double weight_decay) {
  if (tensors.empty()) return;
  const DType dtype = tensors.front().param.dtype();
  for (const AdamWOperands& t : tensors) {
    check_optimizer_operands("adamw_multi_tensor_step", t.param, t.grad,
                             {&t.exp_avg, &t.exp_avg_sq});
    check_on_current_device(t.param, "adamw_multi_tensor_step");
    MT_CHECK(t.param.dtype() == dtype, "adamw_multi_tensor_step: parameters of one call must ",
             "share a dtype, got ", dtype, " and ", t.param.dtype());
    MT_CHECK(t.step >= 1, "adamw_multi_tensor_step: step must be >= 1, got ", t.step);
  }
  MT_CUDA_DISPATCH_FLOATING(dtype, "adamw_multi_tensor_step", P, [&] {
    using S = std::conditional_t<std::is_same_v<P, double>, double, float>;
    AdamWLaunch<P, S> launch;
    int64_t blocks = 0;
    auto flush = [&] {
      if (launch.count == 0) return;
      adamw_multi_tensor_kernel_impl<P, S>
          <<<unsigned(blocks), kThreads, 0, current_stream()>>>(launch);
      MT_CUDA_CHECK_LAUNCH();
      launch.count = 0;
      blocks = 0;
    };
    for (const AdamWOperands& t : tensors) {
      const int64_t n = t.param.numel();
      if (n == 0) continue;
      const int k = launch.count++;
      launch.p[k] = ptr<P>(t.param);
      launch.g[k] = ptr<P>(t.grad);
      launch.m[k] = ptr<S>(t.exp_avg);
      launch.v[k] = ptr<S>(t.exp_avg_sq);
      launch.numel[k] = n;
      blocks += (n + kBlockElems - 1) / kBlockElems;
      launch.blocks_end[k] = blocks;
      launch.c[k] = AdamWCoefficients<S>::make(lr, beta1, beta2, eps, weight_decay, t.step);
      // Full table, or a grid near the launch limit (2^31 - 1 blocks): launch what is queued.
      if (launch.count == kMaxTensors || blocks > (int64_t(1) << 30)) flush();
    }
    flush();
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
MT_REGISTER_KERNEL(adamw_multi_tensor_kernel, DeviceType::CUDA, adamw_multi_tensor_step);

}  // namespace
}  // namespace mt::runtime::cuda
