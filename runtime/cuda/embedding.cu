// CUDA embedding (runtime/kernels/embedding.h). Forward: ids validated by the index family's
// index_bounds kernel (one host sync for the returned position), then a row gather.
// Backward, deterministic without atomics as on the CPU: positions are sorted by id (cub's radix
// sort is stable, so equal ids stay in increasing position) and the first position of each run
// of equal ids sums the run's gradient rows in order, in f32 for 16-bit dtypes, into its row of
// grad_weight; the result equals the CPU's bitwise.
#include "runtime/cuda/index.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/sorted_positions.cuh"
#include "runtime/kernels/embedding.h"
#include "runtime/kernels/index.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::cuda {
namespace {

int64_t embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&weight, &ids, &out})
    check_on_current_device(*t, "embedding");
  const int64_t V = weight.size(0), D = weight.size(1), n = ids.numel();
  int64_t bad_value = 0;
  const int64_t bad = index_bounds_kernel(ids.device(), ids, V, &bad_value);
  if (bad >= 0) return bad;
  if (D == 0 || n == 0) return -1;
  const int64_t row_stride = weight.stride(0);
  MT_CUDA_DISPATCH_BYTES(weight.element_size(), "embedding", E, [&] {
    MT_CUDA_DISPATCH_INDEX(ids.dtype(), "embedding", I, [&] {
      const E* wp = ptr<E>(weight);
      const I* ip = ptr<I>(ids);
      E* op = ptr<E>(out);
      launch_linear(n * D, [=] __device__(int64_t e) {
        const int64_t i = e / D, j = e % D;
        op[e] = wp[int64_t(ip[i]) * row_stride + j];
      });
    });
  });
  return -1;
}

template <class T>
__global__ void sum_runs(const int64_t* keys, const int32_t* order, const T* grad, T* gw, int64_t n,
                         int64_t D) {
  using A = acc_t<T>;
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const int64_t id = keys[k];
    if (k > 0 && keys[k - 1] == id) continue;  // not the first of its run
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
            ptr<T>(grad_weight), n, D);
    MT_CUDA_CHECK_LAUNCH();
  });
}

MT_REGISTER_KERNEL(embedding_forward_kernel, DeviceType::CUDA, embedding_forward);
MT_REGISTER_KERNEL(embedding_backward_kernel, DeviceType::CUDA, embedding_backward);

}  // namespace
}  // namespace mt::runtime::cuda
