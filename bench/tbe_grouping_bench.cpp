// The host grouping of the CPU kernel of the table-batched embedding backward
// (tbe_grad_entries in runtime/kernels/embedding_bag_grad_entries.h: every contribution of a
// table stably sorted by row id, the runs found), table after table (the CPU backward runs the
// tables on all threads), on gpu_kernels_bench's DLRM workload: 26 tables of 1M rows, batch
// 8192, 20 uniform ids a bag (4.26M ids). Then the host part of the CUDA backward, which groups
// on the device: tbe_table_counts (each table's contributions and distinct rows, the tables on
// all threads).
//   OMP_NUM_THREADS=1 ./build/bench/tbe_grouping_bench [--reps 5]
#include <cstdio>
#include <random>
#include <vector>

#include "bench/bench_args.h"
#include "runtime/kernels/embedding_bag_grad_entries.h"

int main(int argc, char** argv) {
  using namespace mt::runtime;
  const int reps = mt::bench::parse_reps(argc, argv, 5);
  if (reps < 0) return 2;
  const int64_t tables = 26, batch = 8192, per_bag = 20, rows = int64_t(1) << 20, dim = 128;
  TbePlan plan;
  plan.batch_size = batch;
  plan.out_width = tables * dim;
  for (int64_t t = 0; t < tables; ++t) {
    plan.feature_table.push_back(t);
    plan.feature_mean.push_back(0);
    plan.feature_out.push_back(t * dim);
  }
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int64_t> id(0, rows - 1);
  std::vector<int64_t> values(size_t(tables * batch * per_bag)),
      offsets(size_t(tables * batch + 1));
  for (int64_t& v : values) v = id(rng);
  for (size_t i = 0; i < offsets.size(); ++i) offsets[i] = int64_t(i) * per_bag;
  size_t runs = 0;
  const double best = mt::bench::best_ms(reps, [&] {
    runs = 0;
    for (int64_t t = 0; t < tables; ++t) {
      const auto entries =
          tbe_grad_entries<float>(t, dim, plan, values.data(), offsets.data(), nullptr);
      runs += tbe_run_starts(entries).size() - 1;
    }
  });
  std::printf("tbe_grad_entries: %zu ids of %lld tables -> %zu rows: best of %d %.1f ms\n",
              values.size(), (long long)tables, runs, reps, best);
  const std::vector<int64_t> table_rows(size_t(tables), rows);
  size_t counted = 0;
  const double counts_ms = mt::bench::best_ms(reps, [&] {
    counted = 0;
    const auto counts = tbe_table_counts(table_rows, plan, values.data(), offsets.data());
    for (const TbeTableCounts& c : counts) counted += size_t(c.rows);
  });
  std::printf("tbe_table_counts: %zu rows: best of %d %.1f ms\n", counted, reps, counts_ms);
  return 0;
}
