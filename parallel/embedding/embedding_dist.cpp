// Shared pieces of the sharded embedding collections (see the header).
#include "parallel/embedding/embedding_dist.h"

#include "parallel/expert/token_exchange.h"
#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"

namespace mt::parallel {

using runtime::DType;
using runtime::RowSparseGrad;
using runtime::Tensor;
using runtime::TensorOptions;

namespace {

// A 1-rank group whose device is not the tensors' (one GPU, an MPI group): every collective here
// is the identity, so it is skipped rather than copied to the host and back.
bool skip(const ProcessGroup& group, const Tensor& t) {
  return group.size() == 1 && t.device() != group.device();
}

TensorOptions on_group(ProcessGroup& group, DType dtype) {
  return TensorOptions{}.with_dtype(dtype).with_device(group.device());
}

}  // namespace

Tensor exchange_rows(const std::shared_ptr<ProcessGroup>& group, const Tensor& x,
                     std::vector<int64_t> out_splits, std::vector<int64_t> in_splits,
                     const std::string& name) {
  if (skip(*group, x)) {
    MT_CHECK(out_splits == in_splits && in_splits.size() == 1 && in_splits[0] == x.size(0), name,
             ": one rank must send itself all ", x.size(0), " rows and receive them");
    return x;
  }
  const Tensor out = all_to_all_rows(group, x.to(group->device()), std::move(out_splits),
                                     std::move(in_splits), name);
  return out.to(x.device());
}

Tensor reduce_scatter_rows(ProcessGroup& group, const Tensor& in, const std::string& name) {
  MT_CHECK(in.dim() == 2 && in.size(0) % group.size() == 0, name, ": expected [", group.size(),
           " * rows, cols] rows to reduce-scatter, got shape ", in.shape());
  if (skip(group, in)) return in;
  const Tensor out =
      runtime::empty({in.size(0) / group.size(), in.size(1)}, on_group(group, in.dtype()));
  group.reduce_scatter_into(out, in.to(group.device()), ReduceOp::Sum, name);
  return out.to(in.device());
}

Tensor all_gather_rows(ProcessGroup& group, const Tensor& in, const std::string& name) {
  MT_CHECK(in.dim() == 2, name, ": expected [rows, cols] to all-gather, got shape ", in.shape());
  if (skip(group, in)) return in;
  const Tensor out =
      runtime::empty({group.size() * in.size(0), in.size(1)}, on_group(group, in.dtype()));
  group.all_gather_into(out, in.to(group.device()), name);
  return out.to(in.device());
}

std::vector<int64_t> all_gather_batch_sizes(ProcessGroup& group, int64_t batch,
                                            const std::string& name) {
  const Tensor mine = runtime::from_vector<int64_t>({batch}, {1, 1}, {DType::I64});
  return all_gather_rows(group, mine, name).to_vector<int64_t>();
}

std::vector<RowSparseGrad> all_reduce_row_grads(ProcessGroup& group,
                                                const std::vector<Tensor>& weights,
                                                const std::vector<RowSparseGrad>& grads,
                                                DType dtype, const std::string& name) {
  std::vector<int64_t> base(weights.size() + 1, 0);
  for (size_t i = 0; i < weights.size(); ++i)
    base[i + 1] = base[i] + weights[i].size(0) * (weights[i].size(1) + 1);
  // The sum runs on the group's device (the weights' for one rank); the result goes to the
  // weights' device.
  const runtime::Device where =
      group.size() == 1 && !weights.empty() ? weights.front().device() : group.device();
  const TensorOptions opts = TensorOptions{}.with_dtype(dtype).with_device(where);
  Tensor buf = runtime::zeros({base.back()}, opts);
  auto dense_of = [&](size_t i) {
    const Tensor& w = weights[i];
    return buf.narrow(0, base[i], w.size(0) * w.size(1)).view({w.size(0), w.size(1)});
  };
  auto counts_of = [&](size_t i) {
    const Tensor& w = weights[i];
    return buf.narrow(0, base[i] + w.size(0) * w.size(1), w.size(0));
  };
  for (const RowSparseGrad& r : grads) {
    MT_CHECK(r.table >= 0 && size_t(r.table) < weights.size(), name, ": a gradient names table ",
             r.table, " of ", weights.size());
    const size_t i = size_t(r.table);
    const Tensor rows = r.rows.to(buf.device());
    runtime::index_add_(dense_of(i), 0, rows, r.values.to(buf.device()).to(dtype));
    runtime::index_add_(counts_of(i), 0, rows, runtime::ones({rows.numel()}, opts));
  }
  if (!skip(group, buf)) group.all_reduce(buf, ReduceOp::Sum, name);
  std::vector<RowSparseGrad> summed;
  for (size_t i = 0; i < weights.size(); ++i) {
    const std::vector<double> counts = counts_of(i).to_vector<double>();
    std::vector<int64_t> rows;
    for (size_t r = 0; r < counts.size(); ++r)
      if (counts[r] > 0.5) rows.push_back(int64_t(r));
    if (rows.empty()) continue;
    RowSparseGrad s;
    s.table = int64_t(i);
    const Tensor picked =
        runtime::from_vector<int64_t>(rows, {int64_t(rows.size())}, opts.with_dtype(DType::I64));
    s.rows = picked.to(weights[i].device());
    s.values = runtime::index_select(dense_of(i), 0, picked).to(weights[i].device());
    s.num_rows = weights[i].size(0);
    summed.push_back(std::move(s));
  }
  return summed;
}

}  // namespace mt::parallel
