// CPU kernels of the table-batched embedding family: the forward is one OpenMP loop (dynamic
// chunks) over the F * B (feature, sample) bags, each summing its rows into an L1-resident
// accumulator while the rows of the values a few positions ahead are prefetched (random row reads
// are latency bound otherwise); the backward
// groups each table's (id, value position) pairs by a stable sort on id
// (runtime/kernels/embedding_bag_grad_entries.h) and sums every run in position order (no
// atomics), tables in parallel.
#include "runtime/kernels/embedding_bag.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include "runtime/cpu/loops.h"
#include "runtime/kernels/embedding_bag_grad_entries.h"

namespace mt::runtime::cpu {
namespace {

constexpr int64_t kPrefetchDistance = 16;  // values ahead

template <class T>
struct TableView {
  std::vector<const T*> data;
  std::vector<int64_t> rows, dims;
  explicit TableView(const std::vector<Tensor>& tables) {
    for (const Tensor& t : tables) {
      data.push_back(t.data<T>());
      rows.push_back(t.size(0));
      dims.push_back(t.size(1));
    }
  }
};

inline void prefetch_row(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 0);
}

template <class T>
int64_t forward_impl(const std::vector<Tensor>& tables, const Tensor& values, const Tensor& offsets,
                     const Tensor& weights, const TbePlan& plan, Tensor& out) {
  using C = compute_t<T>;
  const TableView<T> tv(tables);
  const int64_t F = int64_t(plan.feature_table.size()), B = plan.batch_size;
  const int64_t* v = values.data<int64_t>();
  const int64_t* o = offsets.data<int64_t>();
  const C* w = weights.defined() ? weights.data<C>() : nullptr;
  T* po = out.data<T>();
  const int64_t nbags = F * B;
  int64_t max_dim = 1;
  for (int64_t d : tv.dims) max_dim = std::max(max_dim, d);
  std::atomic<int64_t> bad{INT64_MAX};
  auto note_bad = [&](int64_t i) {
    int64_t cur = bad.load();
    while (i < cur && !bad.compare_exchange_weak(cur, i)) {
    }
  };
  const int64_t n = values.numel();
  const int64_t work_per_bag = std::max<int64_t>(1, (n / std::max<int64_t>(nbags, 1)) * max_dim);
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / work_per_bag);
  auto run_bags = [&](int64_t begin, int64_t end) {
    std::vector<C> acc(static_cast<size_t>(max_dim));
    C* a = acc.data();
    // Look-ahead cursor over this chunk's values (contiguous: bags are in value order): the row
    // of the value kPrefetchDistance positions ahead is prefetched, across bag and table
    // boundaries, so the row fetches of consecutive bags overlap.
    // The cursor's feature (and so table) advances at multiples of B bags: no division per value.
    const int64_t v_end = o[end];
    int64_t pf_i = o[begin], pf_bag = begin, pf_f = begin / B, pf_f_end = (pf_f + 1) * B;
    const T* pf_tab = tv.data[plan.feature_table[pf_f]];
    int64_t pf_rows = tv.rows[plan.feature_table[pf_f]], pf_dim = tv.dims[plan.feature_table[pf_f]];
    auto prefetch_upto = [&](int64_t upto) {
      for (upto = std::min(upto, v_end); pf_i < upto; ++pf_i) {
        while (pf_i >= o[pf_bag + 1]) {
          if (++pf_bag == pf_f_end) {
            ++pf_f;
            pf_f_end += B;
            const int64_t t = plan.feature_table[pf_f];
            pf_tab = tv.data[t];
            pf_rows = tv.rows[t];
            pf_dim = tv.dims[t];
          }
        }
        const int64_t id = v[pf_i];
        if (id >= 0 && id < pf_rows)
          prefetch_row(pf_tab + id * pf_dim, pf_dim * int64_t(sizeof(T)));
      }
    };
    for (int64_t bag = begin; bag < end; ++bag) {
      const int64_t f = bag / B, b = bag % B, t = plan.feature_table[f];
      const int64_t D = tv.dims[t], V = tv.rows[t];
      const T* tab = tv.data[t];
      const int64_t s = o[bag], e = o[bag + 1];
      if (plan.pooled) {
        std::fill(a, a + D, C(0));
        for (int64_t i = s; i < e; ++i) {
          prefetch_upto(i + kPrefetchDistance + 1);
          const int64_t id = v[i];
          if (id < 0 || id >= V) [[unlikely]] {
            note_bad(i);
            continue;
          }
          const T* __restrict r = tab + id * D;
          C* __restrict acc_row = a;
          if (w) {
            const C wi = w[i];
            for (int64_t j = 0; j < D; ++j) acc_row[j] += wi * C(r[j]);
          } else {
            for (int64_t j = 0; j < D; ++j) acc_row[j] += C(r[j]);
          }
        }
        T* dst = po + b * plan.out_width + plan.feature_out[f];
        if (plan.feature_mean[f] && e > s) {
          const C len = C(e - s);
          for (int64_t j = 0; j < D; ++j) dst[j] = T(a[j] / len);
        } else {
          for (int64_t j = 0; j < D; ++j) dst[j] = T(a[j]);
        }
      } else {
        T* dst = po + plan.feature_out[f] + (s - o[f * B]) * D;
        for (int64_t i = s; i < e; ++i, dst += D) {
          prefetch_upto(i + kPrefetchDistance + 1);
          const int64_t id = v[i];
          if (id < 0 || id >= V) [[unlikely]] {
            note_bad(i);
            continue;
          }
          std::memcpy(dst, tab + id * D, size_t(D) * sizeof(T));
        }
      }
    }
  };
  // Dynamic chunks of bags: tables differ in size and cache behaviour, so equal static halves
  // leave a thread idle. Each bag is still computed by one thread in a fixed order.
  const int64_t chunk = std::max<int64_t>(grain, 256);
  const int64_t num_chunks = (nbags + chunk - 1) / chunk;
  if (nbags == 0) {
    // nothing to look up
  } else if (num_chunks <= 1 || omp_get_max_threads() == 1 || omp_in_parallel()) {
    run_bags(0, nbags);
  } else {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t c = 0; c < num_chunks; ++c) run_bags(c * chunk, std::min(nbags, (c + 1) * chunk));
  }
  const int64_t first_bad = bad.load();
  return first_bad == INT64_MAX ? -1 : first_bad;
}

template <class T>
std::vector<RowSparseGrad> backward_impl(const std::vector<Tensor>& tables, const Tensor& values,
                                         const Tensor& offsets, const Tensor& weights,
                                         const TbePlan& plan, const Tensor& grad_out) {
  using C = compute_t<T>;
  const TableView<T> tv(tables);
  const int64_t num_tables = int64_t(tables.size());
  const int64_t* v = values.data<int64_t>();
  const int64_t* o = offsets.data<int64_t>();
  const C* w = weights.defined() ? weights.data<C>() : nullptr;
  const T* pg = grad_out.data<T>();

  std::vector<RowSparseGrad> result(static_cast<size_t>(num_tables));
  std::vector<uint8_t> used(size_t(num_tables), 0);
#pragma omp parallel for schedule(dynamic, 1) if (num_tables > 1 && !omp_in_parallel())
  for (int64_t t = 0; t < num_tables; ++t) {
    const int64_t D = tv.dims[t];
    const std::vector<TbeGradEntry<C>> entries = tbe_grad_entries<C>(t, D, plan, v, o, w);
    if (entries.empty()) continue;
    const std::vector<int64_t> starts = tbe_run_starts(entries);
    const int64_t unique = int64_t(starts.size()) - 1;
    RowSparseGrad g;
    g.table = t;
    g.num_rows = tv.rows[t];
    g.rows = Tensor::empty({unique}, TensorOptions{}.with_dtype(DType::I64));
    g.values = Tensor::empty({unique, D}, tables[t].options());
    int64_t* pr = g.rows.data<int64_t>();
    T* pv = g.values.data<T>();
    std::vector<C> acc(static_cast<size_t>(D));
    for (int64_t u = 0; u < unique; ++u) {
      pr[u] = entries[size_t(starts[u])].id;
      std::fill(acc.begin(), acc.end(), C(0));
      for (int64_t k = starts[u]; k < starts[u + 1]; ++k) {
        const TbeGradEntry<C>& en = entries[size_t(k)];
        const T* src = pg + en.src;
        if (en.scale == C(1)) {
          for (int64_t j = 0; j < D; ++j) acc[j] += C(src[j]);
        } else {
          for (int64_t j = 0; j < D; ++j) acc[j] += en.scale * C(src[j]);
        }
      }
      for (int64_t j = 0; j < D; ++j) pv[u * D + j] = T(acc[j]);
    }
    result[t] = std::move(g);
    used[t] = 1;
  }
  std::vector<RowSparseGrad> out;
  for (int64_t t = 0; t < num_tables; ++t)
    if (used[t]) out.push_back(std::move(result[t]));
  return out;
}

int64_t cpu_tbe_forward(const std::vector<Tensor>& tables, const Tensor& values,
                        const Tensor& offsets, const Tensor& weights, const TbePlan& plan,
                        Tensor& out) {
  int64_t r = -1;
  dispatch_floating(out.dtype(), "embedding_bags_batched", [&](auto tag) {
    r = forward_impl<decltype(tag)>(tables, values, offsets, weights, plan, out);
  });
  return r;
}

std::vector<RowSparseGrad> cpu_tbe_backward(const std::vector<Tensor>& tables, const Tensor& values,
                                            const Tensor& offsets, const Tensor& weights,
                                            const TbePlan& plan, const Tensor& grad_out) {
  std::vector<RowSparseGrad> r;
  dispatch_floating(grad_out.dtype(), "embedding_bags_batched_backward", [&](auto tag) {
    r = backward_impl<decltype(tag)>(tables, values, offsets, weights, plan, grad_out);
  });
  return r;
}

}  // namespace

MT_REGISTER_KERNEL(tbe_forward_kernel, DeviceType::CPU, cpu_tbe_forward);
MT_REGISTER_KERNEL(tbe_backward_kernel, DeviceType::CPU, cpu_tbe_backward);

}  // namespace mt::runtime::cpu

namespace mt::runtime {

std::vector<TbeTableCounts> tbe_table_counts(const std::vector<int64_t>& table_rows,
                                             const TbePlan& plan, const int64_t* values,
                                             const int64_t* offsets) {
  const int64_t num_tables = int64_t(table_rows.size()), B = plan.batch_size;
  std::vector<TbeTableCounts> counts(table_rows.size());
#pragma omp parallel for schedule(dynamic, 1) if (num_tables > 1 && !omp_in_parallel())
  for (int64_t t = 0; t < num_tables; ++t) {
    const int64_t rows = table_rows[size_t(t)];
    std::vector<int64_t> ids;
    for (size_t f = 0; f < plan.feature_table.size(); ++f) {
      if (plan.feature_table[f] != t) continue;
      for (int64_t i = offsets[int64_t(f) * B]; i < offsets[int64_t(f + 1) * B]; ++i)
        if (values[i] >= 0 && values[i] < rows) ids.push_back(values[i]);
    }
    TbeTableCounts& c = counts[size_t(t)];
    c.entries = int64_t(ids.size());
    if (ids.size() * 64 >= size_t(rows)) {  // a bitmap of the rows is the cheaper count
      std::vector<uint64_t> seen(size_t(rows + 63) / 64, 0);
      for (int64_t id : ids) {
        uint64_t& word = seen[size_t(id) / 64];
        const uint64_t bit = uint64_t(1) << (id % 64);
        c.rows += (word & bit) == 0;
        word |= bit;
      }
    } else {
      std::sort(ids.begin(), ids.end());
      c.rows = int64_t(std::unique(ids.begin(), ids.end()) - ids.begin());
    }
  }
  return counts;
}

}  // namespace mt::runtime
