// The host-side grouping of the CPU kernel of the table-batched embedding backward
// (runtime/kernels/embedding_bag.h, runtime/cpu/embedding_bag.cpp; the CUDA kernel groups on the
// device in the same order, sized by tbe_table_counts): every gradient contribution a batch makes
// to one table, as
// (row id, where its gradient row starts in grad_out, scale), stably sorted by id. A run of equal
// ids is one row of the table's RowSparseGrad, its contributions summed in the order given here
// (increasing value position), so results do not depend on threads or devices.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
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
// Stable sort by id: a least-significant-digit radix sort, 11 bits a pass over the bits the
// largest id uses (2 passes for a million rows), a pass skipped where every id shares its digit.
// O(n) a pass against stable_sort's O(n log n): grouping 26 tables of 164K ids (1M rows each)
// took 102 ms instead of 371 on one core of the 2-core dev VM.
template <class C>
void tbe_sort_by_id(std::vector<TbeGradEntry<C>>& entries) {
  if (entries.size() < 2) return;
  int64_t min_id = entries[0].id, max_id = entries[0].id;
  for (const TbeGradEntry<C>& e : entries) {
    min_id = std::min(min_id, e.id);
    max_id = std::max(max_id, e.id);
  }
  if (min_id < 0) {  // not from a checked batch; order as signed numbers all the same
    std::stable_sort(
        entries.begin(), entries.end(),
        [](const TbeGradEntry<C>& a, const TbeGradEntry<C>& b) { return a.id < b.id; });
    return;
  }
  constexpr int kBits = 11;
  constexpr uint64_t kMask = (uint64_t(1) << kBits) - 1;
  std::vector<TbeGradEntry<C>> sorted(entries.size());
  for (int shift = 0; shift < 64 && (uint64_t(max_id) >> shift) != 0; shift += kBits) {
    std::array<size_t, kMask + 1> start{};
    for (const TbeGradEntry<C>& e : entries) ++start[(uint64_t(e.id) >> shift) & kMask];
    if (*std::max_element(start.begin(), start.end()) == entries.size()) continue;
    size_t sum = 0;
    for (size_t& c : start) sum += std::exchange(c, sum);
    for (const TbeGradEntry<C>& e : entries) sorted[start[(uint64_t(e.id) >> shift) & kMask]++] = e;
    entries.swap(sorted);
  }
}

template <class C>
std::vector<TbeGradEntry<C>> tbe_grad_entries(int64_t table, int64_t dim, const TbePlan& plan,
                                              const int64_t* values, const int64_t* offsets,
                                              const C* weights) {
  const int64_t F = int64_t(plan.feature_table.size()), B = plan.batch_size;
  std::vector<TbeGradEntry<C>> entries;
  size_t count = 0;
  for (int64_t f = 0; f < F; ++f)
    if (plan.feature_table[size_t(f)] == table)
      count += size_t(offsets[(f + 1) * B] - offsets[f * B]);
  entries.reserve(count);
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
  tbe_sort_by_id(entries);
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

// Per table, what a device backend needs to size the table's RowSparseGrad without reading its
// grouping back from the device: the batch's contributions to it (`entries`, ids inside the table
// only) and the distinct rows they touch (`rows`). table_rows[t] is table t's row count. The
// tables on all OpenMP threads: compiled in runtime/cpu/embedding_bag.cpp (the CUDA backend's
// nvcc-compiled files are not OpenMP).
struct TbeTableCounts {
  int64_t entries = 0, rows = 0;
};
std::vector<TbeTableCounts> tbe_table_counts(const std::vector<int64_t>& table_rows,
                                             const TbePlan& plan, const int64_t* values,
                                             const int64_t* offsets);

}  // namespace mt::runtime
