// CUDA kernels of the fused optimizer updates (runtime/kernels/optim.h): one pass per parameter
// (one thread per element) or one launch per 48 parameters (multi-tensor AdamW, vector loads),
// with the CPU kernels' arithmetic (runtime/kernels/optim_update.h).
#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/multi_tensor.cuh"
#include "runtime/cuda/packed.cuh"
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

// Multi-tensor AdamW (multi_tensor.cuh): each block updates kBlockElems elements of one
// parameter, by packs of V elements (16-byte loads of bf16/f32 parameters) when every pointer of
// the launch is aligned for them.
constexpr int64_t kBlockElems = 8 * kThreads;

template <class P, class S>
struct AdamWLaunch {
  P* p[kMaxTensorsPerLaunch];
  const P* g[kMaxTensorsPerLaunch];
  S* m[kMaxTensorsPerLaunch];
  S* v[kMaxTensorsPerLaunch];
  AdamWCoefficients<S> c[kMaxTensorsPerLaunch];
  TensorBlocks blocks;
};

// scale: the grad_scale (null: none).
template <class P, class S, int V>
__global__ void adamw_multi_tensor_kernel_impl(const __grid_constant__ AdamWLaunch<P, S> a,
                                               const double* scale) {
  const S s = scale != nullptr ? S(*scale) : S(1);
  const auto grad = [&](P g) { return scale != nullptr ? scaled_grad(g, s) : S(g); };
  int64_t begin, end;
  const int t = a.blocks.locate(blockIdx.x, kBlockElems, begin, end);
  P* p = a.p[t];
  const P* g = a.g[t];
  S* m = a.m[t];
  S* v = a.v[t];
  const int64_t packs_end = begin / V + (end - begin) / V;  // begin is a multiple of V
  for (int64_t i = begin / V + threadIdx.x; i < packs_end; i += blockDim.x) {
    Pack<P, V> pp = load_pack<V>(p, i);
    const Pack<P, V> gp = load_pack<V>(g, i);
    Pack<S, V> mp = load_pack<V>(m, i), vp = load_pack<V>(v, i);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      S pj = S(pp.v[j]);
      adamw_update(grad(gp.v[j]), pj, mp.v[j], vp.v[j], a.c[t]);
      pp.v[j] = P(pj);
    }
    store_pack<V>(p, i, pp);
    store_pack<V>(m, i, mp);
    store_pack<V>(v, i, vp);
  }
  for (int64_t i = packs_end * V + threadIdx.x; i < end; i += blockDim.x) {
    S pi = S(p[i]);
    adamw_update(grad(g[i]), pi, m[i], v[i], a.c[t]);
    p[i] = P(pi);
  }
}

void adamw_multi_tensor_step(const std::vector<AdamWOperands>& tensors, double lr, double beta1,
                             double beta2, double eps, double weight_decay,
                             const Tensor& grad_scale) {
  if (tensors.empty()) return;
  const DType dtype = tensors.front().param.dtype();
  check_grad_scale("adamw_multi_tensor_step", grad_scale, tensors.front().param.device());
  const double* scale = grad_scale.defined() ? ptr<double>(grad_scale) : nullptr;
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
    constexpr int V = pack_width<P, S>();
    AdamWLaunch<P, S> launch;
    auto flush = [&] {
      launch_blocks<V>(launch.blocks, [&](auto width) {
        adamw_multi_tensor_kernel_impl<P, S, decltype(width)::value>
            <<<unsigned(launch.blocks.blocks), kThreads, 0, current_stream()>>>(launch, scale);
        MT_CUDA_CHECK_LAUNCH();
      });
    };
    for (const AdamWOperands& t : tensors) {
      const int64_t n = t.param.numel();
      if (n == 0) continue;
      P* p = ptr<P>(t.param);
      const P* g = ptr<P>(t.grad);
      S* m = ptr<S>(t.exp_avg);
      S* v = ptr<S>(t.exp_avg_sq);
      const int k = launch.blocks.add(n, kBlockElems, packable<V>(p, g, m, v));
      launch.p[k] = p;
      launch.g[k] = g;
      launch.m[k] = m;
      launch.v[k] = v;
      launch.c[k] = AdamWCoefficients<S>::make(lr, beta1, beta2, eps, weight_decay, t.step);
      if (launch.blocks.full()) flush();
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
