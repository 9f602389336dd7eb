// CUDA kernel of the fused embedding-row optimizers (runtime/kernels/embedding_optim.h): one warp
// per touched row (rows are distinct, so warps never share a row), lanes over the columns; the
// row reduction of Adagrad and partial row-wise Adam is a warp shuffle sum. The arithmetic is the
// CPU kernel's (runtime/kernels/embedding_optim_update.h), in f32 (f64 for f64 tables).
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/embedding_optim.h"
#include "runtime/kernels/embedding_optim_update.h"

namespace mt::runtime::cuda {
namespace {

constexpr int kWarp = 32;

template <class T>
__global__ void row_update_kernel(RowOptimizer kind, RowOptimizerCoefficients<acc_t<T>> c,
                                  T* weight, const int64_t* rows, const T* grad,
                                  acc_t<T>* element_m, acc_t<T>* element_v, acc_t<T>* row_state,
                                  int64_t U, int64_t D) {
  using S = acc_t<T>;
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / kWarp;
  for (int64_t u = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; u < U; u += warps) {
    const int64_t r = rows[u];
    T* w = weight + r * D;
    const T* g = grad + u * D;
    S factor = S(0);
    if (row_reduction_needed(kind)) {
      S sq = S(0);
      for (int64_t j = lane; j < D; j += kWarp) sq += row_square_term(kind, S(g[j]), S(w[j]), c);
      for (int off = kWarp / 2; off > 0; off /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, off);
      S state = row_state[r];  // every lane computes the factor; lane 0 stores the state
      __syncwarp();
      factor = row_factor(kind, sq, &state, c);
      if (lane == 0) row_state[r] = state;
    }
    S* m = element_m != nullptr ? element_m + r * D : nullptr;
    S* v = element_v != nullptr ? element_v + r * D : nullptr;
    for (int64_t j = lane; j < D; j += kWarp)
      w[j] = convert<T>(
          row_update(kind, S(g[j]), S(w[j]), factor, m ? m + j : nullptr, v ? v + j : nullptr, c));
  }
}

void cuda_row_update(RowOptimizer kind, const RowOptimizerHyper& hyper, const Tensor& weight,
                     const Tensor& rows, const Tensor& grad, const Tensor& momentum1,
                     const Tensor& momentum2) {
  for (const Tensor* t :
       std::initializer_list<const Tensor*>{&weight, &rows, &grad, &momentum1, &momentum2})
    check_on_current_device(*t, "embedding_row_update");
  const int64_t D = weight.size(1), U = rows.numel();
  if (U == 0 || D == 0) return;
  MT_CUDA_DISPATCH_FLOATING(weight.dtype(), "embedding_row_update", T, [&] {
    using S = acc_t<T>;
    S* m1 = momentum1.defined() ? ptr<S>(momentum1) : nullptr;
    S* m2 = momentum2.defined() ? ptr<S>(momentum2) : nullptr;
    // As on the CPU: Adam's m1 and m2 and partial row-wise Adam's m1 are per element; Adagrad's m1
    // and partial row-wise Adam's m2 are the [V, 1] row state.
    S* element_m =
        kind == RowOptimizer::Adam || kind == RowOptimizer::PartialRowwiseAdam ? m1 : nullptr;
    S* element_v = kind == RowOptimizer::Adam ? m2 : nullptr;
    S* row_state = kind == RowOptimizer::RowwiseAdagrad       ? m1
                   : kind == RowOptimizer::PartialRowwiseAdam ? m2
                                                              : nullptr;
    row_update_kernel<T><<<blocks_for(U * kWarp), kThreads, 0, current_stream()>>>(
        kind, RowOptimizerCoefficients<S>::make(hyper, D), ptr<T>(weight), ptr<int64_t>(rows),
        ptr<T>(grad), element_m, element_v, row_state, U, D);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

MT_REGISTER_KERNEL(embedding_row_update_kernel, DeviceType::CUDA, cuda_row_update);

}  // namespace mt::runtime::cuda
