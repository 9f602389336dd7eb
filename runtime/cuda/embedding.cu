// CUDA embedding (runtime/kernels/embedding.h). Forward: a row gather of ids the op has checked
// with index_bounds (which reports a bad one later, without a host sync; such ids are skipped).
// Backward, deterministic without atomics as on the CPU: positions are sorted by id (cub's radix
// sort is stable, so equal ids stay in increasing position) and the first position of each run
// of equal ids sums the run's gradient rows in order, in f32 for 16-bit dtypes, into its row of
// grad_weight; the result equals the CPU's bitwise.
#include "runtime/cuda/index.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/sorted_positions.cuh"
#include "runtime/kernels/embedding.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::cuda {
namespace {

void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&weight, &ids, &out})
    check_on_current_device(*t, "embedding");
  const int64_t V = weight.size(0), D = weight.size(1), n = ids.numel();
  if (D == 0 || n == 0) return;
  const int64_t row_stride = weight.stride(0);
  MT_CUDA_DISPATCH_BYTES(weight.element_size(), "embedding", E, [&] {
    MT_CUDA_DISPATCH_INDEX(ids.dtype(), "embedding", I, [&] {
      const E* wp = ptr<E>(weight);
      const I* ip = ptr<I>(ids);
      E* op = ptr<E>(out);
      launch_linear(n * D, [=] __device__(int64_t e) {
        const int64_t i = e / D, j = e % D, id = int64_t(ip[i]);
        op[e] = in_range(id, V) ? wp[id * row_stride + j] : E{};
      });
    });
  });
}

template <class T>
__global__ void sum_runs(const int64_t* keys, const int32_t* order, const T* grad, T* gw, int64_t n,
                         int64_t V, int64_t D) {
  using A = acc_t<T>;
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const int64_t id = keys[k];
    if (k > 0 && keys[k - 1] == id) continue;  // not the first of its run
    if (!in_range(id, V)) continue;           // reported by the forward's check
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      A acc = A(gw[id * D + j]);
      for (int64_t m = k; m < n && keys[m] == id; ++m) acc += A(grad[int64_t(order[m]) * D + j]);
      gw[id * D + j] = convert<T>(acc);
    }
  }
}

void embedding_backward(const Tensor& grad, const Tensor& ids, Tensor& grad_weight) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&grad, &ids, &grad_weight})
    check_on_current_device(*t, "embedding_backward");
  const int64_t V = grad_weight.size(0), D = grad_weight.size(1), n = ids.numel();
  if (D == 0 || n == 0) return;
  const SortedPositions sorted = sort_positions_by_value(ids, V, "embedding_backward");
  MT_CUDA_DISPATCH_FLOATING(grad.dtype(), "embedding_backward", T, [&] {
    sum_runs<T>
        <<<unsigned(std::min<int64_t>(n, 1 << 20)), threads_for_inner(D), 0, current_stream()>>>(
            ptr<int64_t>(sorted.keys), ptr<int32_t>(sorted.order), ptr<T>(grad),
            ptr<T>(grad_weight), n, V, D);
    MT_CUDA_CHECK_LAUNCH();
  });
}

MT_REGISTER_KERNEL(embedding_forward_kernel, DeviceType::CUDA, embedding_forward);
MT_REGISTER_KERNEL(embedding_backward_kernel, DeviceType::CUDA, embedding_backward);

}  // namespace
}  // namespace mt::runtime::cuda
