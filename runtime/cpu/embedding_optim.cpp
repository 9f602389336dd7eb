// CPU kernel of the fused embedding-row optimizers: OpenMP over the touched rows, each row read
// and written once (state included), arithmetic in the state dtype (f32, f64 for f64 tables).
#include "runtime/kernels/embedding_optim.h"

#include <cmath>

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
  const S lr = S(h.lr), eps = S(h.eps), b1 = S(h.beta1), b2 = S(h.beta2), wd = S(h.weight_decay);
  const S bc1 = S(1.0 - std::pow(h.beta1, double(h.step)));
  const S bc2 = S(1.0 - std::pow(h.beta2, double(h.step)));
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(D, 1));
  parallel_for(U, grain, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t r = pr[u];
      T* w = pw + r * D;
      const T* g = pg + u * D;
      switch (kind) {
        case RowOptimizer::SGD:
          for (int64_t j = 0; j < D; ++j) w[j] = T(S(w[j]) - lr * (S(g[j]) + wd * S(w[j])));
          break;
        case RowOptimizer::RowwiseAdagrad: {
          S sq = 0;
          for (int64_t j = 0; j < D; ++j) {
            const S gj = S(g[j]) + wd * S(w[j]);
            sq += gj * gj;
          }
          m1[r] += sq / S(D);
          const S mult = lr / (std::sqrt(m1[r]) + eps);
          for (int64_t j = 0; j < D; ++j) w[j] = T(S(w[j]) - mult * (S(g[j]) + wd * S(w[j])));
          break;
        }
        case RowOptimizer::Adam: {
          S* m = m1 + r * D;
          S* v = m2 + r * D;
          for (int64_t j = 0; j < D; ++j) {
            const S gj = S(g[j]);
            m[j] = b1 * m[j] + (S(1) - b1) * gj;
            v[j] = b2 * v[j] + (S(1) - b2) * gj * gj;
            const S wj = S(w[j]);
            w[j] = T(wj - lr * ((m[j] / bc1) / (std::sqrt(v[j] / bc2) + eps) + wd * wj));
          }
          break;
        }
        case RowOptimizer::PartialRowwiseAdam: {
          S* m = m1 + r * D;
          S sq = 0;
          for (int64_t j = 0; j < D; ++j) sq += S(g[j]) * S(g[j]);
          m2[r] = b2 * m2[r] + (S(1) - b2) * (sq / S(D));
          const S denom = std::sqrt(m2[r] / bc2) + eps;
          for (int64_t j = 0; j < D; ++j) {
            m[j] = b1 * m[j] + (S(1) - b1) * S(g[j]);
            const S wj = S(w[j]);
            w[j] = T(wj - lr * ((m[j] / bc1) / denom + wd * wj));
          }
          break;
        }
      }
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
