// The collectives benchmark on real ranks (mpirun -np 2 and 4): every collective, f32 and bf16,
// even and uneven all_to_all, checks every timed iteration and finds no wrong element; the rows'
// sizes, counts and bandwidths follow nccl-tests' definitions; the raw MPI comparison runs.
#include "parallel/comm/comm_bench.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include "parallel/comm/comm_trace.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/error.h"

namespace mt::parallel {
namespace {

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(MpiProcessGroup::world());
  return pg;
}

TEST(CommBench, EveryCollectiveChecksOutAndReportsNcclTestsBandwidth) {
  const int64_t n = world()->size();
  for (const runtime::DType dtype : {runtime::DType::F32, runtime::DType::BF16}) {
    CommBenchOptions o;
    o.min_bytes = 64;
    o.max_bytes = 4096;
    o.step_factor = 8;
    o.warmup = 1;
    o.iters = 2;
    o.dtype = dtype;
    o.compare_mpi = dtype == runtime::DType::F32;
    const std::vector<CommBenchRow> rows = run_comm_bench(*world(), o);
    ASSERT_EQ(rows.size(), 7u * 3u);  // 7 collectives x sizes 64, 512, 4096
    const int64_t esize = int64_t(runtime::dtype_size(dtype));
    for (const CommBenchRow& r : rows) {
      SCOPED_TRACE(std::string(collective_kind_name(r.kind)) + " " + std::to_string(r.bytes));
      EXPECT_TRUE(r.checked);
      EXPECT_EQ(r.errors, 0);
      EXPECT_EQ(r.bytes, r.count * esize);
      EXPECT_LE(r.min_s, r.avg_s);
      EXPECT_LE(r.avg_s, r.max_s);
      EXPECT_GT(r.max_s, 0);
      EXPECT_DOUBLE_EQ(r.algbw, double(r.bytes) / r.max_s);
      EXPECT_DOUBLE_EQ(r.busbw, r.algbw * bus_factor(r.kind, n));
      if (r.kind == CollectiveKind::AllGather || r.kind == CollectiveKind::ReduceScatter ||
          r.kind == CollectiveKind::AllToAll) {
        EXPECT_EQ(r.count % n, 0);  // split evenly over the ranks
      }
      EXPECT_EQ(r.mpi_max_s > 0, o.compare_mpi);
    }
  }
}

TEST(CommBench, UnevenAllToAllReportsTheBottleneckRank) {
  const int64_t n = world()->size();
  CommBenchOptions o;
  o.min_bytes = o.max_bytes = 4 * 100 * n;  // 100 f32 per peer before the skew
  o.ops = {CollectiveKind::AllToAll};
  o.skew = 1.0;
  o.warmup = 0;
  o.iters = 2;
  const std::vector<CommBenchRow> rows = run_comm_bench(*world(), o);
  ASSERT_EQ(rows.size(), 1u);
  const CommBenchRow& r = rows[0];
  EXPECT_TRUE(r.uneven);
  EXPECT_EQ(r.errors, 0);
  EXPECT_EQ(r.busbw, 0);  // no meaning for uneven blocks
  // Rank r sends 100 x (1 + ((r + 2j) mod n) / (n - 1)) floats to rank j: recompute the
  // off-rank bytes of every rank and the largest.
  int64_t best = -1, best_bytes = -1;
  for (int64_t from = 0; from < n; ++from) {
    int64_t bytes = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (j == from) continue;
      const auto rows_of = [&](int64_t a, int64_t b) {
        return int64_t(std::llround(100.0 * (1.0 + double((a + 2 * b) % n) / double(n - 1))));
      };
      bytes += 4 * (rows_of(from, j) + rows_of(j, from));
    }
    if (bytes > best_bytes) {
      best = from;
      best_bytes = bytes;
    }
  }
  EXPECT_EQ(r.bottleneck_rank, best);
  EXPECT_EQ(r.bottleneck_bytes, best_bytes);
  EXPECT_DOUBLE_EQ(r.bottleneck_bw, double(best_bytes) / r.max_s);
}

// A distribution recorded in training: each rank's first uneven all_to_all in a [comm] trace dump
// (here written by the test: rank r sent (r + 1) x (j + 1) KiB to rank j) sets the blocks, scaled
// so that the mean rank sends the row's size; the check passes and the rank with the most off-rank
// bytes is the bottleneck.
TEST(CommBench, AllToAllDistributionFromATrace) {
  const int64_t n = world()->size();
  const std::filesystem::path dump =
      std::filesystem::temp_directory_path() / ("mt_comm_bench_a2a_" + std::to_string(getppid()));
  if (world()->rank() == 0) {
    std::filesystem::create_directories(dump / "comm");
    for (int64_t r = 0; r < n; ++r) {
      std::ofstream f(dump / "comm" / ("rank-" + std::to_string(r) + ".jsonl"));
      CommRecord even;
      even.collective = "all_to_all_single";
      even.name = "ep.dispatch.counts";
      even.send_bytes = even.recv_bytes = std::vector<int64_t>(size_t(n), 8);
      f << comm_record_json(even, 1, int(r)) << "\n";
      CommRecord uneven = even;
      uneven.name = "ep.dispatch";
      uneven.send_bytes.clear();
      for (int64_t j = 0; j < n; ++j) uneven.send_bytes.push_back((r + 1) * (j + 1) * 1024);
      f << comm_record_json(uneven, 1, int(r)) << "\n";
    }
  }
  world()->barrier("dump written");
  CommBenchOptions o;
  o.all_to_all_weights = all_to_all_weights_from_trace(dump.string(), "ep.dispatch", n);
  ASSERT_EQ(o.all_to_all_weights.size(), size_t(n));
  EXPECT_DOUBLE_EQ(o.all_to_all_weights[1][0], 2 * 1024);
  EXPECT_THROW(all_to_all_weights_from_trace(dump.string(), "no.such.call", n), mt::Error);
  EXPECT_THROW(all_to_all_weights_from_trace(dump.string(), "", n + 1), mt::Error);
  o.min_bytes = o.max_bytes = 4 * 64 * n;
  o.ops = {CollectiveKind::AllToAll};
  o.warmup = 0;
  o.iters = 2;
  const std::vector<CommBenchRow> rows = run_comm_bench(*world(), o);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(rows[0].uneven);
  EXPECT_EQ(rows[0].errors, 0);
  // Off-rank weight of rank r: what it sends and receives, its own block excluded; the first of
  // equals is the bottleneck (on 2 ranks both move the same bytes).
  int64_t best = -1, best_weight = -1;
  for (int64_t r = 0; r < n; ++r) {
    int64_t w = 0;
    for (int64_t j = 0; j < n; ++j) w += j == r ? 0 : 2 * (r + 1) * (j + 1);
    if (w > best_weight) {
      best = r;
      best_weight = w;
    }
  }
  EXPECT_EQ(rows[0].bottleneck_rank, best);
  world()->barrier("bench done");
  if (world()->rank() == 0) std::filesystem::remove_all(dump);
}

}  // namespace
}  // namespace mt::parallel
