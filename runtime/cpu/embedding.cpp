// CPU embedding: row gather forward; deterministic scatter-add backward (ids sorted by value then
// position, each distinct id's rows summed in order by one thread, no atomics).
#include "runtime/kernels/embedding.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "runtime/cpu/loops.h"

namespace mt::runtime::cpu {
namespace {

std::vector<int64_t> read_ids(const Tensor& ids) {
  const int64_t n = ids.numel();
  std::vector<int64_t> out(static_cast<size_t>(n));
  if (ids.dtype() == DType::I32) {
    const int32_t* p = ids.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    const int64_t* p = ids.data<int64_t>();
    std::copy(p, p + n, out.begin());
  }
  return out;
}

void cpu_embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  const int64_t D = weight.size(1), n = ids.numel();
  if (D == 0 || n == 0) return;
  const std::vector<int64_t> idx = read_ids(ids);
  const size_t row_bytes = size_t(D) * weight.element_size();
  const int64_t row_stride_bytes = weight.stride(0) * int64_t(weight.element_size());
  const char* pw = static_cast<const char*>(weight.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / D);
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      std::memcpy(po + i * int64_t(row_bytes), pw + idx[i] * row_stride_bytes, row_bytes);
  });
}

void cpu_embedding_backward(const Tensor& grad, const Tensor& ids, Tensor& grad_weight) {
  const int64_t D = grad_weight.size(1), n = ids.numel();
  if (D == 0 || n == 0) return;
  const std::vector<int64_t> idx = read_ids(ids);
  // Positions sorted by (id, position): equal ids form runs in increasing position.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return idx[a] < idx[b]; });
  std::vector<int64_t> run_start;
  for (int64_t k = 0; k < n; ++k)
    if (k == 0 || idx[order[k]] != idx[order[k - 1]]) run_start.push_back(k);
  run_start.push_back(n);
  const int64_t runs = int64_t(run_start.size()) - 1;

  dispatch_floating(grad.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = compute_t<T>;
    const T* pg = grad.data<T>();
    T* pw = grad_weight.data<T>();
    const int64_t grain =
        std::max<int64_t>(1, kParallelGrain / (D * std::max<int64_t>(1, n / runs)));
    parallel_for(runs, grain, [&](int64_t begin, int64_t end) {
      std::vector<A> acc(static_cast<size_t>(D));
      for (int64_t r = begin; r < end; ++r) {
        T* dst = pw + idx[order[run_start[r]]] * D;
        for (int64_t j = 0; j < D; ++j) acc[j] = A(dst[j]);
        for (int64_t k = run_start[r]; k < run_start[r + 1]; ++k) {
          const T* src = pg + order[k] * D;
          for (int64_t j = 0; j < D; ++j) acc[j] += A(src[j]);
        }
        for (int64_t j = 0; j < D; ++j) dst[j] = T(acc[j]);
      }
    });
  });
}

}  // namespace

MT_REGISTER_KERNEL(embedding_forward_kernel, DeviceType::CPU, cpu_embedding_forward);
MT_REGISTER_KERNEL(embedding_backward_kernel, DeviceType::CPU, cpu_embedding_backward);

}  // namespace mt::runtime::cpu
