#include "runtime/sparse/row_sparse_grad.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"

namespace mt::runtime::sparse {

RowSparseGrad merge(const RowSparseGrad& a, const RowSparseGrad& b) {
  MT_CHECK(a.table == b.table && a.num_rows == b.num_rows,
           "RowSparseGrad merge: gradients of different tables (", a.table, " and ", b.table, ")");
  MT_CHECK(a.values.dtype() == b.values.dtype() && a.values.size(1) == b.values.size(1),
           "RowSparseGrad merge: ", a.values.dtype(), " ", a.values.shape(), " and ",
           b.values.dtype(), " ", b.values.shape());
  NoGradGuard ng;
  const std::vector<int64_t> ra = a.rows.to_vector<int64_t>(), rb = b.rows.to_vector<int64_t>();
  std::vector<int64_t> rows;
  std::set_union(ra.begin(), ra.end(), rb.begin(), rb.end(), std::back_inserter(rows));
  // Row indices live with the values (CPU or CUDA).
  const TensorOptions index_options =
      TensorOptions{}.with_dtype(DType::I64).with_device(a.values.device());
  auto position = [&](const std::vector<int64_t>& r) {
    std::vector<int64_t> pos(r.size());
    for (size_t i = 0; i < r.size(); ++i)
      pos[i] = std::lower_bound(rows.begin(), rows.end(), r[i]) - rows.begin();
    return from_vector(pos, {int64_t(pos.size())}, index_options);
  };
  RowSparseGrad out;
  out.table = a.table;
  out.num_rows = a.num_rows;
  out.rows = from_vector(rows, {int64_t(rows.size())}, index_options);
  Tensor v = zeros({int64_t(rows.size()), a.values.size(1)}, a.values.options());
  index_add_(v, 0, position(ra), a.values);
  index_add_(v, 0, position(rb), b.values);
  out.values = v;
  return out;
}

void accumulate(std::vector<RowSparseGrad>& acc, const std::vector<RowSparseGrad>& more) {
  for (const RowSparseGrad& g : more) {
    auto it = std::lower_bound(acc.begin(), acc.end(), g.table,
                               [](const RowSparseGrad& x, int64_t t) { return x.table < t; });
    if (it != acc.end() && it->table == g.table) {
      *it = merge(*it, g);
    } else {
      acc.insert(it, g);
    }
  }
}

double row_sparse_norm_pow(const std::vector<RowSparseGrad>& grads, double norm_type) {
  MT_CHECK(norm_type > 0, "row_sparse_norm_pow: norm_type must be > 0, got ", norm_type);
  double acc = 0;
  for (const RowSparseGrad& g : grads) {
    if (!g.values.defined()) continue;
    const std::vector<double> v = g.values.to_vector<double>();
    for (double x : v) {
      if (std::isinf(norm_type)) {
        acc = std::max(acc, std::abs(x));
      } else {
        acc += norm_type == 2.0 ? x * x : std::pow(std::abs(x), norm_type);
      }
    }
  }
  return acc;
}

void scale_(std::vector<RowSparseGrad>& grads, double coef) {
  NoGradGuard ng;
  for (RowSparseGrad& g : grads)
    if (g.values.defined()) g.values.copy_(mul(g.values, coef));
}

}  // namespace mt::runtime::sparse
