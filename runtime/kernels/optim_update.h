// The per-element arithmetic of the fused optimizer updates (runtime/kernels/optim.h), written
// once for the CPU kernels (runtime/cpu/optim.cpp) and the CUDA kernels (runtime/cuda/optim.cu):
// coefficients are made on the host in f64 and rounded to the state type S (f32, or f64 for f64
// parameters); the update of one element is a host+device function of S values.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace mt::runtime {

template <class S>
struct AdamWCoefficients {
  S decay, w1, b2, w2, step_size, bc2_sqrt, eps;

  static AdamWCoefficients make(double lr, double beta1, double beta2, double eps,
                                double weight_decay, int64_t step) {
    return {S(1.0 - lr * weight_decay),
            S(1.0 - beta1),
            S(beta2),
            S(1.0 - beta2),
            S(lr / (1.0 - std::pow(beta1, double(step)))),
            S(std::sqrt(1.0 - std::pow(beta2, double(step)))),
            S(eps)};
  }
};

// A gradient element multiplied by a clipping coefficient in S and rounded to its dtype P: the
// value clip_grads_with_norm_ leaves in a gradient (runtime/optim/clip_grad.h).
template <class P, class S>
MT_HOST_DEVICE inline S scaled_grad(P g, S scale) {
  return S(P(S(g) * scale));
}

// One AdamW element: p, m, v updated in place from gradient g.
template <class S>
MT_HOST_DEVICE inline void adamw_update(S g, S& p, S& m, S& v, const AdamWCoefficients<S>& c) {
  p *= c.decay;
  m += c.w1 * (g - m);
  v = c.b2 * v + c.w2 * g * g;
  p -= c.step_size * m / (std::sqrt(v) / c.bc2_sqrt + c.eps);
}

template <class S>
struct SgdCoefficients {
  S lr, weight_decay, momentum, damp;  // damp = 1 - dampening
  bool nesterov, first_step;

  static SgdCoefficients make(double lr, double momentum, double dampening, double weight_decay,
                              bool nesterov, bool first_step) {
    return {S(lr), S(weight_decay), S(momentum), S(1.0 - dampening), nesterov, first_step};
  }
};

// One SGD element: p (and the momentum buffer `buf`, when non-null) updated in place.
template <class S>
MT_HOST_DEVICE inline S sgd_update(S g, S p, S* buf, const SgdCoefficients<S>& c) {
  S d = g;
  if (c.weight_decay != S(0)) d += c.weight_decay * p;
  if (buf != nullptr) {
    const S b = c.first_step ? d : c.momentum * *buf + c.damp * d;
    *buf = b;
    d = c.nesterov ? d + c.momentum * b : b;
  }
  return p - c.lr * d;
}

}  // namespace mt::runtime
