// Shared pieces of the sharded embedding collections (see the header).
#include "parallel/embedding/embedding_dist.h"

#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"

namespace mt::parallel {

using runtime::DType;
using runtime::RowSparseGrad;
using runtime::Tensor;
using runtime::TensorOptions;

std::vector<int64_t> all_gather_batch_sizes(ProcessGroup& group, int64_t batch,
                                            const std::string& name) {
  const TensorOptions i64 = TensorOptions{}.with_dtype(DType::I64);
  Tensor mine = runtime::from_vector<int64_t>({batch}, {1}, i64);
  Tensor all = runtime::empty({group.size()}, i64);
  group.all_gather_into(all, mine, name);
  return all.to_vector<int64_t>();
}

std::vector<RowSparseGrad> all_reduce_row_grads(ProcessGroup& group,
                                                const std::vector<Tensor>& weights,
                                                const std::vector<RowSparseGrad>& grads,
                                                DType dtype, const std::string& name) {
  std::vector<int64_t> base(weights.size() + 1, 0);
  for (size_t i = 0; i < weights.size(); ++i)
    base[i + 1] = base[i] + weights[i].size(0) * (weights[i].size(1) + 1);
  const TensorOptions opts = TensorOptions{}.with_dtype(dtype);
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
    runtime::index_add_(dense_of(i), 0, r.rows, r.values.to(dtype));
    runtime::index_add_(counts_of(i), 0, r.rows, runtime::ones({r.rows.numel()}, opts));
  }
  group.all_reduce(buf, ReduceOp::Sum, name);
  std::vector<RowSparseGrad> summed;
  for (size_t i = 0; i < weights.size(); ++i) {
    const std::vector<double> counts = counts_of(i).to_vector<double>();
    std::vector<int64_t> rows;
    for (size_t r = 0; r < counts.size(); ++r)
      if (counts[r] > 0.5) rows.push_back(int64_t(r));
    if (rows.empty()) continue;
    RowSparseGrad s;
    s.table = int64_t(i);
    s.rows = runtime::from_vector<int64_t>(rows, {int64_t(rows.size())},
                                           TensorOptions{}.with_dtype(DType::I64));
    s.values = runtime::index_select(dense_of(i), 0, s.rows);
    s.num_rows = weights[i].size(0);
    summed.push_back(std::move(s));
  }
  return summed;
}

}  // namespace mt::parallel
