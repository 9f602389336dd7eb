#include "runtime/ops/embedding_bag.h"

#include <omp.h>

#include <algorithm>

#include "runtime/autograd/function.h"
#include "runtime/core/grad_mode.h"
#include "runtime/cpu/loops.h"
#include "runtime/kernels/embedding_bag.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"

namespace mt::runtime {

const char* pooling_name(PoolingMode mode) { return mode == PoolingMode::Mean ? "MEAN" : "SUM"; }

Tensor RowSparseGrad::to_dense() const {
  MT_CHECK(values.defined() && values.dim() == 2, "RowSparseGrad::to_dense: no gradient rows");
  NoGradGuard ng;
  return index_add(zeros({num_rows, values.size(1)}, values.options()), 0, rows, values);
}

namespace {

struct Prepared {
  std::vector<Tensor> tables;
  Device device;                    // the tables' (CPU when there are none)
  Tensor values, offsets, weights;  // on `device`, for the forward kernel
  // Host copies: validation, layout, error messages and the backward's grouping by row.
  Tensor host_values, host_offsets, host_weights;
  TbePlan plan;
};

std::string feature_label(const TableBatchLayout& layout, int64_t f) {
  if (f < int64_t(layout.feature_names.size())) return "'" + layout.feature_names[f] + "'";
  return std::to_string(f);
}

// The error for the id at value position `bad`, outside its feature's table.
[[noreturn]] void fail_at_id(const char* op, const Prepared& p, const TableBatchLayout& layout,
                             int64_t batch_size, int64_t bad) {
  const int64_t* o = p.host_offsets.data<int64_t>();
  const int64_t n_bags = int64_t(layout.feature_table.size()) * batch_size;
  const int64_t bag = int64_t(std::upper_bound(o, o + n_bags + 1, bad) - o) - 1;
  const int64_t f = bag / batch_size, t = layout.feature_table[f];
  MT_FAIL(op, ": id ", p.host_values.data<int64_t>()[bad], " of feature ", feature_label(layout, f),
          ", sample ", bag % batch_size, " (value ", bad, ") is outside [0, ", p.tables[t].size(0),
          ") of table ", t);
}

// The ids of device tables, checked on their host copies before the launch (the CPU kernel finds
// a bad one in passing): the host never waits for a device's verdict.
void check_ids(const char* op, const Prepared& p, const TableBatchLayout& layout,
               int64_t batch_size) {
  const int64_t* v = p.host_values.data<int64_t>();
  const int64_t* o = p.host_offsets.data<int64_t>();
  for (int64_t f = 0; f < int64_t(layout.feature_table.size()); ++f) {
    // Unsigned: a negative id compares above every row count.
    const uint64_t rows = uint64_t(p.tables[layout.feature_table[f]].size(0));
    const int64_t begin = o[f * batch_size], end = o[(f + 1) * batch_size];
    // On every thread first (millions of ids per GPU step), then the first bad one is found.
    int any_bad = 0;
    const bool threaded = end - begin > cpu::kParallelGrain && !omp_in_parallel();
#pragma omp parallel for reduction(max : any_bad) if (threaded)
    for (int64_t i = begin; i < end; ++i) any_bad = std::max(any_bad, int(uint64_t(v[i]) >= rows));
    if (!any_bad) continue;
    const int64_t* bad =
        std::find_if(v + begin, v + end, [&](int64_t id) { return uint64_t(id) >= rows; });
    fail_at_id(op, p, layout, batch_size, int64_t(bad - v));
  }
}

Prepared prepare(const char* op, const std::vector<Tensor>& tables, const Tensor& values,
                 const Tensor& offsets, int64_t batch_size, const TableBatchLayout& layout,
                 const Tensor& per_sample_weights, bool pooled) {
  Prepared p;
  const int64_t F = int64_t(layout.feature_table.size());
  MT_CHECK(batch_size >= 0, op, ": negative batch size ", batch_size);
  MT_CHECK(layout.feature_pooling.empty() || int64_t(layout.feature_pooling.size()) == F, op, ": ",
           layout.feature_pooling.size(), " pooling modes for ", F, " features");
  MT_CHECK(layout.feature_names.empty() || int64_t(layout.feature_names.size()) == F, op, ": ",
           layout.feature_names.size(), " feature names for ", F, " features");
  DType dtype = DType::F32;
  for (size_t t = 0; t < tables.size(); ++t) {
    const Tensor& tab = tables[t];
    MT_CHECK(tab.defined() && tab.dim() == 2 && tab.is_floating_point(), op, ": table ", t,
             " must be a floating [rows, dim] tensor, got ",
             tab.defined() ? dtype_name(tab.dtype()) : "undefined", " ",
             tab.defined() ? tab.shape() : Shape{});
    if (t == 0) {
      dtype = tab.dtype();
      p.device = tab.device();
    }
    MT_CHECK(tab.device() == p.device, op, ": table ", t, " is on ", tab.device(),
             " but table 0 is on ", p.device, " (one device per batched lookup)");
    MT_CHECK(tab.dtype() == dtype, op, ": table ", t, " is ", tab.dtype(), " but table 0 is ",
             dtype, " (one dtype per batched lookup)");
    p.tables.push_back(tab.detach().contiguous());
  }
  for (int64_t f = 0; f < F; ++f)
    MT_CHECK(layout.feature_table[f] >= 0 && layout.feature_table[f] < int64_t(tables.size()), op,
             ": feature ", feature_label(layout, f), " reads table ", layout.feature_table[f],
             " but there are ", tables.size(), " tables");
  MT_CHECK(values.defined() && values.dim() == 1 &&
               (values.dtype() == DType::I64 || values.dtype() == DType::I32),
           op, ": expected 1-D i64 values (ids), got ",
           values.defined() ? dtype_name(values.dtype()) : "undefined", " ",
           values.defined() ? values.shape() : Shape{});
  MT_CHECK(offsets.defined() && offsets.dim() == 1 &&
               (offsets.dtype() == DType::I64 || offsets.dtype() == DType::I32),
           op, ": expected 1-D i64 offsets");
  MT_CHECK(offsets.numel() == F * batch_size + 1, op, ": expected ", F * batch_size + 1,
           " offsets for ", F, " features and batch ", batch_size, ", got ", offsets.numel());
  {
    NoGradGuard ng;
    p.host_values = values.detach().to(DType::I64).to(Device::cpu()).contiguous();
    p.host_offsets = offsets.detach().to(DType::I64).to(Device::cpu()).contiguous();
    if (!p.device.is_cpu()) {  // the backward's snapshot: the caller may reuse its buffers
      if (p.host_values.shares_storage_with(values)) p.host_values = p.host_values.clone();
      if (p.host_offsets.shares_storage_with(offsets)) p.host_offsets = p.host_offsets.clone();
    }
    // Queued (through pinned memory): the host does not wait for the device's earlier work.
    p.values = p.host_values.to(p.device, /*non_blocking=*/true);
    p.offsets = p.host_offsets.to(p.device, /*non_blocking=*/true);
  }
  const int64_t N = p.host_values.numel();
  const int64_t* o = p.host_offsets.data<int64_t>();
  MT_CHECK(o[0] == 0, op, ": offsets must start at 0, got ", o[0]);
  for (int64_t i = 0; i < F * batch_size; ++i)
    MT_CHECK(o[i + 1] >= o[i], op, ": offsets decrease at feature ",
             feature_label(layout, i / batch_size), ", sample ", i % batch_size);
  MT_CHECK(o[F * batch_size] == N, op, ": offsets end at ", o[F * batch_size], " but there are ", N,
           " values");
  if (per_sample_weights.defined()) {
    MT_CHECK(pooled, op, ": per-sample weights apply to pooled lookups only");
    MT_CHECK(per_sample_weights.is_floating_point() && per_sample_weights.numel() == N, op,
             ": expected ", N, " floating per-sample weights, got ",
             dtype_name(per_sample_weights.dtype()), " ", per_sample_weights.shape());
    NoGradGuard ng;
    // A host copy for the backward (weights given on the device cost a copy back here).
    p.host_weights = per_sample_weights.detach()
                         .reshape({N})
                         .to(dtype == DType::F64 ? DType::F64 : DType::F32)
                         .to(Device::cpu())
                         .contiguous();
    if (!p.device.is_cpu() && p.host_weights.shares_storage_with(per_sample_weights))
      p.host_weights = p.host_weights.clone();  // the backward's snapshot, as the ids'
    p.weights = p.host_weights.to(p.device, /*non_blocking=*/true);
  }
  if (!p.device.is_cpu()) check_ids(op, p, layout, batch_size);
  TbePlan& plan = p.plan;
  plan.batch_size = batch_size;
  plan.pooled = pooled;
  plan.feature_table = layout.feature_table;
  plan.feature_mean.assign(size_t(F), 0);
  plan.feature_out.resize(size_t(F));
  int64_t acc = 0;
  for (int64_t f = 0; f < F; ++f) {
    const int64_t D = p.tables[layout.feature_table[f]].size(1);
    if (pooled) {
      plan.feature_mean[f] =
          !layout.feature_pooling.empty() && layout.feature_pooling[f] == PoolingMode::Mean;
      plan.feature_out[f] = acc;
      acc += D;
    } else {
      plan.feature_out[f] = acc;
      acc += (o[(f + 1) * batch_size] - o[f * batch_size]) * D;
    }
  }
  plan.out_width = acc;
  return p;
}

Tensor run(const char* op, const std::vector<Tensor>& tables, const Tensor& values,
           const Tensor& offsets, int64_t batch_size, const TableBatchLayout& layout,
           const Tensor& per_sample_weights, const TableGradSink& sink, bool pooled) {
  Prepared p = prepare(op, tables, values, offsets, batch_size, layout, per_sample_weights, pooled);
  const DType dtype = p.tables.empty() ? DType::F32 : p.tables[0].dtype();
  const TensorOptions out_options = TensorOptions{}.with_dtype(dtype).with_device(p.device);
  Tensor out = pooled ? empty({batch_size, p.plan.out_width}, out_options)
                      : empty({p.plan.out_width}, out_options);
  const int64_t bad =
      tbe_forward_kernel(p.device, p.tables, p.values, p.offsets, p.weights, p.plan, out);
  if (bad >= 0) fail_at_id(op, p, layout, batch_size, bad);

  const bool to_sink = sink != nullptr && GradMode::enabled();
  const bool dense = sink == nullptr && autograd::any_requires_grad(tables);
  if (!to_sink && !dense) return out;
  // The backward groups the ids by row on the host: it keeps the host copies.
  auto backward = [tabs = p.tables, sv = autograd::SavedTensor(p.host_values),
                   so = autograd::SavedTensor(p.host_offsets),
                   sw = autograd::SavedTensor(p.host_weights), plan = p.plan, sink, dense,
                   n = tables.size()](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
    const Tensor g = args.grad(0).contiguous();
    std::vector<RowSparseGrad> grads =
        tbe_backward_kernel(g.device(), tabs, sv.get(), so.get(), sw.get(), plan, g);
    if (!dense) {
      sink(grads);
      return {};
    }
    std::vector<Tensor> out(n);
    for (RowSparseGrad& rg : grads)
      if (args.needs(size_t(rg.table))) out[rg.table] = rg.to_dense();
    for (size_t t = 0; t < n; ++t)
      if (args.needs(t) && !out[t].defined()) out[t] = zeros(tabs[t].shape(), tabs[t].options());
    return out;
  };
  autograd::record(op, dense ? tables : std::vector<Tensor>{}, {out}, std::move(backward));
  return out;
}

}  // namespace

Tensor embedding_bags_batched(const std::vector<Tensor>& tables, const Tensor& values,
                              const Tensor& offsets, int64_t batch_size,
                              const TableBatchLayout& layout, const Tensor& per_sample_weights,
                              const TableGradSink& sink) {
  return run("embedding_bags_batched", tables, values, offsets, batch_size, layout,
             per_sample_weights, sink, true);
}

Tensor embedding_lookup_batched(const std::vector<Tensor>& tables, const Tensor& values,
                                const Tensor& offsets, int64_t batch_size,
                                const TableBatchLayout& layout, const TableGradSink& sink) {
  return run("embedding_lookup_batched", tables, values, offsets, batch_size, layout, Tensor(),
             sink, false);
}

}  // namespace mt::runtime
