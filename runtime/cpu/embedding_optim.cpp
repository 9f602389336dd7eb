// CPU kernel of the fused embedding-row optimizers: OpenMP over the touched rows, each row read
// and written once (state included), arithmetic in the state dtype (f32, f64 for f64 tables);
// the formulas are runtime/kernels/embedding_optim_update.h.
#include "runtime/kernels/embedding_optim.h"

#include "runtime/kernels/embedding_optim_update.h"

#include "runtime/cpu/loops.h"

namespace mt::runtime::cpu {
namespace {

template <class T>
void update_impl(RowOptimizer kind, const RowOptimizerHyper& h, const Tensor& weight,
                 const Tensor& rows, const Tensor& grad, const Tensor& momentum1,
                 const Tensor& momentum2) {
  using S = compute_t<T>;
  const int64_t D = weight.size(1), U = rows.numel();
  T* pw = weight.data<T>();
  const int64_t* pr = rows.data<int64_t>();
  const T* pg = grad.data<T>();
  S* m1 = momentum1.defined() ? momentum1.data<S>() : nullptr;
  S* m2 = momentum2.defined() ? momentum2.data<S>() : nullptr;
  const auto c = RowOptimizerCoefficients<S>::make(h, D);
  // Per-element moments: Adam's m1 and m2 [V, D], partial row-wise Adam's m1 [V, D]; row state
  // [V, 1]: Adagrad's m1, partial row-wise Adam's m2.
  const bool element_m = kind == RowOptimizer::Adam || kind == RowOptimizer::PartialRowwiseAdam;
  const bool element_v = kind == RowOptimizer::Adam;
  S* row_state = kind == RowOptimizer::RowwiseAdagrad       ? m1
                 : kind == RowOptimizer::PartialRowwiseAdam ? m2
                                                            : nullptr;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(D, 1));
  parallel_for(U, grain, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t r = pr[u];
      T* w = pw + r * D;
      const T* g = pg + u * D;
      S factor = 0;
      if (row_reduction_needed(kind)) {
        S sq = 0;
        for (int64_t j = 0; j < D; ++j) sq += row_square_term(kind, S(g[j]), S(w[j]), c);
        factor = row_factor(kind, sq, row_state + r, c);
      }
      S* m = element_m ? m1 + r * D : nullptr;
      S* v = element_v ? m2 + r * D : nullptr;
      for (int64_t j = 0; j < D; ++j)
        w[j] = T(row_update(kind, S(g[j]), S(w[j]), factor, m ? m + j : nullptr,
                            v ? v + j : nullptr, c));
    }
  });
}

void cpu_row_update(RowOptimizer kind, const RowOptimizerHyper& hyper, const Tensor& weight,
                    const Tensor& rows, const Tensor& grad, const Tensor& momentum1,
                    const Tensor& momentum2) {
  dispatch_floating(weight.dtype(), "embedding_row_update", [&](auto tag) {
    update_impl<decltype(tag)>(kind, hyper, weight, rows, grad, momentum1, momentum2);
  });
}

}  // namespace

MT_REGISTER_KERNEL(embedding_row_update_kernel, DeviceType::CPU, cpu_row_update);

}  // namespace mt::runtime::cpu
