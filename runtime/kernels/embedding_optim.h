// Kernel table of the fused embedding-row optimizer update (used by
// runtime/sparse/fused_optimizer.h): applies one optimizer step to the rows a batch touched, with
// the gradient already summed per row (FBGEMM's "exact" optimizers), one row per loop iteration
// (rows are distinct, so rows are independent and results do not depend on the thread count).
//
// Operands: weight [V, D] contiguous; rows i64 [U] distinct, in [0, V); grad [U, D] of weight's
// dtype; state f32 (f64 for f64 weights), contiguous: momentum1 / momentum2 as listed below
// (undefined when unused). Hyper-parameters in f64; step t >= 1 is the optimizer's iteration.
//   SGD                   g' = g + wd*w;  w -= lr * g'
//   RowwiseAdagrad        g' = g + wd*w;  m1[r] += mean_j(g'_j^2)        (m1 [V, 1])
//                         w -= lr / (sqrt(m1[r]) + eps) * g'
//   Adam                  m1 = b1 m1 + (1-b1) g;  m2 = b2 m2 + (1-b2) g^2  (m1, m2 [V, D])
//                         w -= lr * (m1/(1-b1^t) / (sqrt(m2/(1-b2^t)) + eps) + wd*w)
//   PartialRowwiseAdam    as Adam with m2 [V, 1]: m2[r] = b2 m2[r] + (1-b2) mean_j(g_j^2)
// (FBGEMM's formulas, Adam's weight decay decoupled and Adagrad's L2 as its weight_decay_mode;
// FBGEMM's EXACT_SGD has no weight decay: ours adds L2, nothing at the default weight_decay 0.)
// Kernels: runtime/cpu/embedding_optim.cpp and runtime/cuda/embedding_optim.cu, both through
// the element arithmetic of runtime/kernels/embedding_optim_update.h.
#pragma once

#include <cstdint>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

enum class RowOptimizer : int8_t { SGD, RowwiseAdagrad, Adam, PartialRowwiseAdam };

struct RowOptimizerHyper {
  double lr = 0.01, eps = 1e-8, beta1 = 0.9, beta2 = 0.999, weight_decay = 0.0;
  int64_t step = 1;
};

inline constinit KernelTable<void(RowOptimizer kind, const RowOptimizerHyper& hyper,
                                  const Tensor& weight, const Tensor& rows, const Tensor& grad,
                                  const Tensor& momentum1, const Tensor& momentum2)>
    embedding_row_update_kernel{"embedding_row_update"};

}  // namespace mt::runtime
