// CUDA kernels of the table-batched embedding family (runtime/kernels/embedding_bag.h).
//
// Forward: one warp per (feature, sample) bag, its lanes over the row's columns; a pooled bag sums
// its rows in value order in the compute dtype (as the CPU kernel does), an unpooled bag copies
// them. The per-feature table, rows, dim and output position travel as one small device array.
// The op has checked the ids on the host; an id outside its table is skipped all the same, and
// not reported (the CPU kernel's report comes for free, this one would cost a host wait).
// Backward: the contributions are grouped by row on the device (a stable radix sort of every
// value position by its row, numbered over all tables; group_on_device), in the order the CPU
// kernel's host grouping gives (runtime/kernels/embedding_bag_grad_entries.h: by row, then
// increasing value position), and one warp per touched row sums its gradient rows in that order,
// so the result is the CPU's up to the compute dtype's rounding. The host only counts, on the
// op's host copies of the ids, each table's contributions and distinct rows (tbe_table_counts,
// on all host threads), which size the gradients: neither pass waits for the GPU, and every
// host-to-device copy is queued through pinned memory.
#include <cub/device/device_scan.cuh>

#include <cstring>
#include <vector>

#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/sorted_positions.cuh"
#include "runtime/kernels/embedding_bag.h"
#include "runtime/kernels/embedding_bag_grad_entries.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::cuda {
namespace {

constexpr int kWarp = 32;
// Per feature: table pointer, rows, dim, output position, MEAN flag, and the first row of its
// table in one numbering over all tables (the backward's sort key).
constexpr int kFeatureFields = 6;

// Where each table's rows start in one numbering over all tables, and the total (T + 1 entries).
std::vector<int64_t> table_row_bases(const std::vector<Tensor>& tables) {
  std::vector<int64_t> base(tables.size() + 1, 0);
  for (size_t t = 0; t < tables.size(); ++t) base[t + 1] = base[t] + tables[t].size(0);
  return base;
}

// [F, kFeatureFields] i64 on the device: what each feature's bags read and where they write.
Tensor feature_table_on_device(const std::vector<Tensor>& tables, const TbePlan& plan,
                               Device device) {
  const int64_t F = int64_t(plan.feature_table.size());
  const std::vector<int64_t> row_base = table_row_bases(tables);
  std::vector<int64_t> meta(size_t(F * kFeatureFields));
  for (int64_t f = 0; f < F; ++f) {
    const size_t table = size_t(plan.feature_table[size_t(f)]);
    const Tensor& t = tables[table];
    int64_t* m = meta.data() + f * kFeatureFields;
    m[0] = int64_t(reinterpret_cast<intptr_t>(t.data_ptr()));
    m[1] = t.size(0);
    m[2] = t.size(1);
    m[3] = plan.feature_out[size_t(f)];
    m[4] = plan.feature_mean[size_t(f)];
    m[5] = row_base[table];
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

// The backward's grouping, on the device. Every value position i gets the key
// row_base[table of its feature] + id (one row numbering over all tables; an id outside its table
// gets the total row count and joins no run), and positions are sorted stably by key
// (sorted_positions.cuh): a run of equal keys is one row of one table's RowSparseGrad, its
// contributions in increasing value position, the CPU's order, and a table's runs are contiguous.
struct DeviceGroups {
  SortedPositions sorted;
  Tensor run_id;  // i64 [N]: 1 + the run of sorted position k, counted over all tables
  Tensor src;     // i64 [N]: element offset in grad_out of sorted position k's gradient row
  Tensor scale;   // C [N]: its weight (1 without weights), divided by the bag length for MEAN
};

// Per bag (one thread each): the keys of its values and their bag.
__global__ void tbe_keys(const int64_t* values, const int64_t* offsets, const int64_t* meta,
                         int64_t num_bags, int64_t B, int64_t total_rows, int64_t* keys,
                         int64_t* bag_of) {
  for (int64_t bag = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; bag < num_bags;
       bag += int64_t(gridDim.x) * blockDim.x) {
    const int64_t* m = meta + bag / B * kFeatureFields;
    const int64_t rows = m[1], base = m[5];
    for (int64_t i = offsets[bag]; i < offsets[bag + 1]; ++i) {
      const int64_t id = values[i];
      keys[i] = id >= 0 && id < rows ? base + id : total_rows;
      bag_of[i] = bag;
    }
  }
}

// total_rows: the tables' rows together (the key of an id outside its table).
template <class C>
DeviceGroups group_on_device(const std::vector<Tensor>& tables, const Tensor& values,
                             const Tensor& offsets, const Tensor& weights, const TbePlan& plan,
                             int64_t total_rows) {
  const int64_t N = values.numel(), F = int64_t(plan.feature_table.size()), B = plan.batch_size;
  const TensorOptions i64 = TensorOptions{}.with_dtype(DType::I64).with_device(values.device());
  const Tensor meta = feature_table_on_device(tables, plan, values.device());

  Tensor keys = empty({N}, i64), bag_of = empty({N}, i64);
  tbe_keys<<<blocks_for(F * B), kThreads, 0, current_stream()>>>(
      ptr<int64_t>(values), ptr<int64_t>(offsets), ptr<int64_t>(meta), F * B, B, total_rows,
      ptr<int64_t>(keys), ptr<int64_t>(bag_of));
  MT_CUDA_CHECK_LAUNCH();

  DeviceGroups g{sort_positions_by_value(keys, total_rows, "embedding_bags_batched_backward"),
                 empty({N}, i64), empty({N}, i64),
                 empty({N}, i64.with_dtype(sizeof(C) == 8 ? DType::F64 : DType::F32))};
  const int64_t* sk = ptr<int64_t>(g.sorted.keys);
  const int32_t* order = ptr<int32_t>(g.sorted.order);
  const int64_t* bags = ptr<int64_t>(bag_of);
  const int64_t* o = ptr<int64_t>(offsets);
  const int64_t* md = ptr<int64_t>(meta);
  const C* w = weights.defined() ? ptr<C>(weights) : nullptr;
  const Tensor run_starts = empty({N}, i64);  // 1 where a run starts: summed into run_id below
  int64_t* starts_flag = ptr<int64_t>(run_starts);
  int64_t* src = ptr<int64_t>(g.src);
  C* scale = ptr<C>(g.scale);
  const bool pooled = plan.pooled;
  const int64_t out_width = plan.out_width;
  launch_linear(N, [=] __device__(int64_t k) {
    starts_flag[k] = k == 0 || sk[k] != sk[k - 1];
    const int64_t i = order[k], bag = bags[i], f = bag / B, b = bag % B;
    const int64_t s = o[bag], e = o[bag + 1];
    // As tbe_grad_entries (runtime/kernels/embedding_bag_grad_entries.h) computes them.
    const int64_t* m = md + f * kFeatureFields;
    const C mean_scale = m[4] != 0 && e > s ? C(1) / C(e - s) : C(1);
    scale[k] = (w != nullptr ? w[i] : C(1)) * mean_scale;
    src[k] = pooled ? b * out_width + m[3] : m[3] + (i - o[f * B]) * m[2];
  });
  size_t temp_bytes = 0;
  int64_t* run_id = ptr<int64_t>(g.run_id);
  MT_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, temp_bytes, starts_flag, run_id, int(N),
                                              current_stream()));
  const Tensor temp = empty({int64_t(temp_bytes / 8 + 1)}, i64);
  MT_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp.data_ptr(), temp_bytes, starts_flag, run_id,
                                              int(N), current_stream()));
  return g;
}

// Table `table`'s RowSparseGrad from its sorted positions [kb, ke), with `runs_before` runs before
// kb, U runs of its own and its rows numbered from row_base: its rows and run starts, then one
// warp per row summing the gradient rows of its run.
template <class T>
RowSparseGrad table_grad(int64_t table, const Tensor& weight, const DeviceGroups& g, int64_t kb,
                         int64_t ke, int64_t runs_before, int64_t U, int64_t row_base,
                         const Tensor& grad_out) {
  using C = acc_t<T>;
  const int64_t D = weight.size(1);
  const TensorOptions i64 = TensorOptions{}.with_dtype(DType::I64).with_device(weight.device());
  RowSparseGrad r;
  r.table = table;
  r.num_rows = weight.size(0);
  r.rows = empty({U}, i64);
  r.values = empty({U, D}, weight.options());
  Tensor starts = empty({U + 1}, i64);
  const int64_t* sk = ptr<int64_t>(g.sorted.keys);
  const int64_t* run = ptr<int64_t>(g.run_id);
  int64_t* rows = ptr<int64_t>(r.rows);
  int64_t* st = ptr<int64_t>(starts);
  launch_linear(ke - kb, [=] __device__(int64_t j) {
    const int64_t k = kb + j;
    if (k == kb || sk[k] != sk[k - 1]) {
      const int64_t u = run[k] - 1 - runs_before;
      st[u] = j;
      rows[u] = sk[k] - row_base;
    }
    if (k == ke - 1) st[U] = ke - kb;
  });
  if (D > 0) {
    sum_runs<T><<<blocks_for(U * kWarp), kThreads, 0, current_stream()>>>(
        st, ptr<int64_t>(g.src) + kb, ptr<C>(g.scale) + kb, ptr<T>(grad_out), ptr<T>(r.values),
        U, D);
    MT_CUDA_CHECK_LAUNCH();
  }
  return r;
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
  std::vector<RowSparseGrad> out;
  if (values.numel() == 0 || plan.feature_table.empty() || plan.batch_size == 0) return out;
  // Each table's sorted positions and runs, counted on the host: nothing is read back.
  const std::vector<int64_t> row_base = table_row_bases(tables);
  std::vector<int64_t> rows;
  for (const Tensor& t : tables) rows.push_back(t.size(0));
  const std::vector<TbeTableCounts> counts =
      tbe_table_counts(rows, plan, values.data<int64_t>(), offsets.data<int64_t>());
  // Queued through pinned memory: the host does not wait.
  const Device device = grad_out.device();
  const Tensor values_d = values.to(device, true), offsets_d = offsets.to(device, true);
  const Tensor weights_d = weights.defined() ? weights.to(device, true) : Tensor();
  MT_CUDA_DISPATCH_FLOATING(grad_out.dtype(), "embedding_bags_batched_backward", TT, [&] {
    const DeviceGroups g =
        group_on_device<acc_t<TT>>(tables, values_d, offsets_d, weights_d, plan, row_base.back());
    int64_t kb = 0, runs_before = 0;
    for (size_t t = 0; t < tables.size(); ++t) {
      const TbeTableCounts& c = counts[t];
      if (c.entries > 0)
        out.push_back(table_grad<TT>(int64_t(t), tables[t], g, kb, kb + c.entries, runs_before,
                                     c.rows, row_base[t], grad_out));
      kb += c.entries;
      runs_before += c.rows;
    }
  });
  return out;
}

}  // namespace

MT_REGISTER_KERNEL(tbe_forward_kernel, DeviceType::CUDA, cuda_tbe_forward);
MT_REGISTER_KERNEL(tbe_backward_kernel, DeviceType::CUDA, cuda_tbe_backward);

}  // namespace mt::runtime::cuda
