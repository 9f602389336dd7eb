// CUDA kernels of the table-batched embedding family (runtime/kernels/embedding_bag.h).
//
// Forward: one warp per (feature, sample) bag, its lanes over the row's columns; a pooled bag sums
// its rows in value order in the compute dtype (as the CPU kernel does), an unpooled bag copies
// them. The per-feature table, rows, dim and output position travel as one small device array.
// The op has checked the ids on the host; an id outside its table is skipped all the same, and
// not reported (the CPU kernel's report comes for free, this one would cost a host wait).
// Backward: the grouping of contributions by row is the CPU kernel's host code
// (runtime/kernels/embedding_bag_grad_entries.h, on the op's host copies of values, offsets and
// weights; a radix sort per table, the tables on all host threads), and one warp per touched row
// sums its gradient rows on the device in that order, so the result is the CPU's up to the
// compute dtype's rounding. Every host-to-device copy here is queued through pinned memory:
// neither pass makes the host wait for the GPU. Grouping on the device (a radix sort as in
// embedding.cu) would remove the host work; not done yet.
#include <cstring>
#include <vector>

#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/embedding_bag.h"
#include "runtime/kernels/embedding_bag_grad_entries.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kFeatureFields = 5;  // table pointer, rows, dim, output position, MEAN flag

// [F, kFeatureFields] i64 on the device: what each feature's bags read and where they write.
Tensor feature_table_on_device(const std::vector<Tensor>& tables, const TbePlan& plan,
                               Device device) {
  const int64_t F = int64_t(plan.feature_table.size());
  std::vector<int64_t> meta(size_t(F * kFeatureFields));
  for (int64_t f = 0; f < F; ++f) {
    const Tensor& t = tables[size_t(plan.feature_table[size_t(f)])];
    int64_t* m = meta.data() + f * kFeatureFields;
    m[0] = int64_t(reinterpret_cast<intptr_t>(t.data_ptr()));
    m[1] = t.size(0);
    m[2] = t.size(1);
    m[3] = plan.feature_out[size_t(f)];
    m[4] = plan.feature_mean[size_t(f)];
  }
  return from_vector<int64_t>(meta, {F, kFeatureFields},
                              TensorOptions{}.with_dtype(DType::I64).with_device(device));
}

template <class T>
__global__ void tbe_forward(const int64_t* meta, int64_t num_bags, int64_t B, bool pooled,
                            int64_t out_width, const int64_t* values, const int64_t* offsets,
                            const acc_t<T>* weights, T* out) {
  using C = acc_t<T>;
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / kWarp;
  for (int64_t bag = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; bag < num_bags;
       bag += warps) {
    const int64_t f = bag / B, b = bag % B;
    const int64_t* m = meta + f * kFeatureFields;
    const T* table = reinterpret_cast<const T*>(m[0]);
    const int64_t rows = m[1], D = m[2];
    const int64_t s = offsets[bag], e = offsets[bag + 1];
    auto valid = [&](int64_t id) { return id >= 0 && id < rows; };
    if (!pooled) {
      T* dst = out + m[3] + (s - offsets[f * B]) * D;
      for (int64_t i = s; i < e; ++i, dst += D) {
        const int64_t id = values[i];
        if (!valid(id)) continue;
        for (int64_t j = lane; j < D; j += kWarp) dst[j] = table[id * D + j];
      }
      continue;
    }
    T* dst = out + b * out_width + m[3];
    const bool mean = m[4] != 0 && e > s;
    for (int64_t j0 = 0; j0 < D; j0 += kWarp) {
      const int64_t j = j0 + lane;
      C acc = C(0);
      for (int64_t i = s; i < e; ++i) {
        const int64_t id = values[i];
        if (!valid(id) || j >= D) continue;
        const C x = C(table[id * D + j]);
        if (weights != nullptr) {
          acc += weights[i] * x;
        } else {
          acc += x;
        }
      }
      if (j < D) dst[j] = convert<T>(mean ? acc / C(e - s) : acc);
    }
  }
}

int64_t cuda_tbe_forward(const std::vector<Tensor>& tables, const Tensor& values,
                         const Tensor& offsets, const Tensor& weights, const TbePlan& plan,
                         Tensor& out) {
  for (const Tensor& t : tables) check_on_current_device(t, "embedding_bags_batched");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&values, &offsets, &weights, &out})
    check_on_current_device(*t, "embedding_bags_batched");
  const int64_t num_bags = int64_t(plan.feature_table.size()) * plan.batch_size;
  if (num_bags == 0 || values.numel() == 0) {
    if (plan.pooled) out.zero_();  // every bag is empty: zeros (unpooled: nothing to write)
    return -1;
  }
  const Tensor meta = feature_table_on_device(tables, plan, out.device());
  MT_CUDA_DISPATCH_FLOATING(out.dtype(), "embedding_bags_batched", T, [&] {
    tbe_forward<T><<<blocks_for(num_bags * kWarp), kThreads, 0, current_stream()>>>(
        ptr<int64_t>(meta), num_bags, plan.batch_size, plan.pooled, plan.out_width,
        ptr<int64_t>(values), ptr<int64_t>(offsets),
        weights.defined() ? ptr<acc_t<T>>(weights) : nullptr, ptr<T>(out));
    MT_CUDA_CHECK_LAUNCH();
  });
  return -1;  // the op checked the ids (see the header)
}

// values[u] = sum over entries k of run u, in order, of scale[k] * grad_out[src[k] + j].
template <class T>
__global__ void sum_runs(const int64_t* starts, const int64_t* src, const acc_t<T>* scale,
                         const T* grad_out, T* values, int64_t U, int64_t D) {
  using C = acc_t<T>;
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / kWarp;
  for (int64_t u = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; u < U; u += warps) {
    for (int64_t j = lane; j < D; j += kWarp) {
      C acc = C(0);
      for (int64_t k = starts[u]; k < starts[u + 1]; ++k) {
        const C x = C(grad_out[src[k] + j]);
        if (scale[k] == C(1)) {
          acc += x;
        } else {
          acc += scale[k] * x;
        }
      }
      values[u * D + j] = convert<T>(acc);
    }
  }
}

// Table `table`'s RowSparseGrad from its host groups: uploads them (queued through pinned memory,
// from_vector on a device: the host does not wait) and sums each run's gradient rows.
template <class T>
RowSparseGrad table_grad(int64_t table, const Tensor& weight, const TbeRowGroups<acc_t<T>>& groups,
                         const Tensor& grad_out) {
  using C = acc_t<T>;
  RowSparseGrad g;
  if (groups.rows.empty()) return g;
  const int64_t D = weight.size(1), U = int64_t(groups.rows.size());
  const int64_t n = int64_t(groups.src.size());
  const TensorOptions i64 = TensorOptions{}.with_dtype(DType::I64).with_device(weight.device());
  const Tensor starts_d = from_vector<int64_t>(groups.starts, {U + 1}, i64);
  const Tensor src_d = from_vector<int64_t>(groups.src, {n}, i64);
  const TensorOptions acc = i64.with_dtype(sizeof(C) == 8 ? DType::F64 : DType::F32);
  const Tensor scale_d = from_vector<C>(groups.scale, {n}, acc);
  g.table = table;
  g.num_rows = weight.size(0);
  g.rows = from_vector<int64_t>(groups.rows, {U}, i64);
  g.values = empty({U, D}, weight.options());
  if (D > 0) {
    sum_runs<T><<<blocks_for(U * kWarp), kThreads, 0, current_stream()>>>(
        ptr<int64_t>(starts_d), ptr<int64_t>(src_d), ptr<C>(scale_d), ptr<T>(grad_out),
        ptr<T>(g.values), U, D);
    MT_CUDA_CHECK_LAUNCH();
  }
  return g;
}

std::vector<RowSparseGrad> cuda_tbe_backward(const std::vector<Tensor>& tables,
                                             const Tensor& values, const Tensor& offsets,
                                             const Tensor& weights, const TbePlan& plan,
                                             const Tensor& grad_out) {
  for (const Tensor& t : tables) check_on_current_device(t, "embedding_bags_batched_backward");
  check_on_current_device(grad_out, "embedding_bags_batched_backward");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&values, &offsets, &weights})
    MT_CHECK(!t->defined() || t->device().is_cpu(),
             "embedding_bags_batched_backward: values, offsets and weights must be the op's host "
             "copies, got a tensor on ",
             t->device());
  const Tensor& v = values;
  const Tensor& o = offsets;
  const Tensor& w = weights;
  std::vector<int64_t> dims;
  for (const Tensor& t : tables) dims.push_back(t.size(1));
  std::vector<RowSparseGrad> out;
  MT_CUDA_DISPATCH_FLOATING(grad_out.dtype(), "embedding_bags_batched_backward", T, [&] {
    using C = acc_t<T>;
    const std::vector<TbeRowGroups<C>> groups =
        tbe_group_rows<C>(dims, plan, v.data<int64_t>(), o.data<int64_t>(),
                          w.defined() ? static_cast<const C*>(w.data_ptr()) : nullptr);
    for (int64_t t = 0; t < int64_t(tables.size()); ++t) {
      RowSparseGrad g = table_grad<T>(t, tables[size_t(t)], groups[size_t(t)], grad_out);
      if (g.table >= 0) out.push_back(std::move(g));
    }
  });
  return out;
}

}  // namespace

MT_REGISTER_KERNEL(tbe_forward_kernel, DeviceType::CUDA, cuda_tbe_forward);
MT_REGISTER_KERNEL(tbe_backward_kernel, DeviceType::CUDA, cuda_tbe_backward);

}  // namespace mt::runtime::cuda
