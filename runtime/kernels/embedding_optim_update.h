// The per-element arithmetic of the fused embedding-row optimizers (runtime/kernels/
// embedding_optim.h), written once for the CPU kernel (runtime/cpu/embedding_optim.cpp) and the
// CUDA kernel (runtime/cuda/embedding_optim.cu). Coefficients are made on the host in f64 and
// rounded to the state type S (f32, or f64 for f64 tables). A row update is: optionally a row
// reduction (sum over the row of row_square_term), then row_update() on every element.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/kernels/embedding_optim.h"
#include "runtime/kernels/optim_update.h"  // MT_HOST_DEVICE

namespace mt::runtime {

template <class S>
struct RowOptimizerCoefficients {
  S lr, eps, b1, b2, wd, bc1, bc2, dim;

  static RowOptimizerCoefficients make(const RowOptimizerHyper& h, int64_t dim) {
    return {S(h.lr),
            S(h.eps),
            S(h.beta1),
            S(h.beta2),
            S(h.weight_decay),
            S(1.0 - std::pow(h.beta1, double(h.step))),
            S(1.0 - std::pow(h.beta2, double(h.step))),
            S(dim > 0 ? dim : 1)};
  }
};

// Whether `kind` needs the row's sum of row_square_term before the element updates.
MT_HOST_DEVICE inline bool row_reduction_needed(RowOptimizer kind) {
  return kind == RowOptimizer::RowwiseAdagrad || kind == RowOptimizer::PartialRowwiseAdam;
}

// The term one element adds to that sum: the squared (L2-decayed, for Adagrad) gradient.
template <class S>
MT_HOST_DEVICE inline S row_square_term(RowOptimizer kind, S g, S w,
                                        const RowOptimizerCoefficients<S>& c) {
  const S gj = kind == RowOptimizer::RowwiseAdagrad ? g + c.wd * w : g;
  return gj * gj;
}

// Updates the row's scalar state from the row sum (once per row, before the elements) and returns
// the per-row factor the element updates use: Adagrad's lr / (sqrt(m1) + eps), partial row-wise
// Adam's denominator sqrt(m2 / bc2) + eps; 0 for the others (unused).
template <class S>
MT_HOST_DEVICE inline S row_factor(RowOptimizer kind, S square_sum, S* row_state,
                                   const RowOptimizerCoefficients<S>& c) {
  using std::sqrt;
  if (kind == RowOptimizer::RowwiseAdagrad) {
    *row_state += square_sum / c.dim;
    return c.lr / (sqrt(*row_state) + c.eps);
  }
  if (kind == RowOptimizer::PartialRowwiseAdam) {
    *row_state = c.b2 * *row_state + (S(1) - c.b2) * (square_sum / c.dim);
    return sqrt(*row_state / c.bc2) + c.eps;
  }
  return S(0);
}

// One element: returns the new weight from the gradient g and the weight w; m and v are the
// element's Adam moments (unused otherwise; partial row-wise Adam uses m only).
template <class S>
MT_HOST_DEVICE inline S row_update(RowOptimizer kind, S g, S w, S factor, S* m, S* v,
                                   const RowOptimizerCoefficients<S>& c) {
  using std::sqrt;
  switch (kind) {
    case RowOptimizer::SGD:
      return w - c.lr * (g + c.wd * w);
    case RowOptimizer::RowwiseAdagrad:
      return w - factor * (g + c.wd * w);
    case RowOptimizer::Adam:
      *m = c.b1 * *m + (S(1) - c.b1) * g;
      *v = c.b2 * *v + (S(1) - c.b2) * g * g;
      return w - c.lr * ((*m / c.bc1) / (sqrt(*v / c.bc2) + c.eps) + c.wd * w);
    case RowOptimizer::PartialRowwiseAdam:
      *m = c.b1 * *m + (S(1) - c.b1) * g;
      return w - c.lr * ((*m / c.bc1) / factor + c.wd * w);
  }
  return w;
}

}  // namespace mt::runtime
