// The host-side grouping of the table-batched embedding backward (runtime/kernels/embedding_bag.h),
// written once for the CPU kernel (runtime/cpu/embedding_bag.cpp) and the CUDA kernel
// (runtime/cuda/embedding_bag.cu): every gradient contribution a batch makes to one table, as
// (row id, where its gradient row starts in grad_out, scale), stably sorted by id. A run of equal
// ids is one row of the table's RowSparseGrad, its contributions summed in the order given here
// (increasing value position), so results do not depend on threads or devices.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/kernels/embedding_bag.h"

namespace mt::runtime {

template <class C>
struct TbeGradEntry {
  int64_t id;
  int64_t src;  // element offset of the gradient row in grad_out
  C scale;      // the per-sample weight (1 without weights), divided by the bag length for MEAN
};

// The entries of table `table` (dim `dim`): values / offsets / weights are host arrays of the
// batch (weights may be null), laid out as the kernels take them.
template <class C>
std::vector<TbeGradEntry<C>> tbe_grad_entries(int64_t table, int64_t dim, const TbePlan& plan,
                                              const int64_t* values, const int64_t* offsets,
                                              const C* weights) {
  const int64_t F = int64_t(plan.feature_table.size()), B = plan.batch_size;
  std::vector<TbeGradEntry<C>> entries;
  for (int64_t f = 0; f < F; ++f) {
    if (plan.feature_table[size_t(f)] != table) continue;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t bag = f * B + b, s = offsets[bag], e = offsets[bag + 1];
      const C mean_scale = plan.feature_mean[size_t(f)] && e > s ? C(1) / C(e - s) : C(1);
      for (int64_t i = s; i < e; ++i) {
        const int64_t src = plan.pooled ? b * plan.out_width + plan.feature_out[size_t(f)]
                                        : plan.feature_out[size_t(f)] + (i - offsets[f * B]) * dim;
        entries.push_back({values[i], src, (weights ? weights[i] : C(1)) * mean_scale});
      }
    }
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const TbeGradEntry<C>& a, const TbeGradEntry<C>& b) { return a.id < b.id; });
  return entries;
}

// Where each run of equal ids starts in `entries`, plus entries.size() at the end: run u is row
// entries[starts[u]].id of the RowSparseGrad, summing entries [starts[u], starts[u + 1]).
template <class C>
std::vector<int64_t> tbe_run_starts(const std::vector<TbeGradEntry<C>>& entries) {
  std::vector<int64_t> starts;
  for (size_t k = 0; k < entries.size(); ++k)
    if (k == 0 || entries[k].id != entries[k - 1].id) starts.push_back(int64_t(k));
  starts.push_back(int64_t(entries.size()));
  return starts;
}

}  // namespace mt::runtime
