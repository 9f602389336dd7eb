// The MPI backend without a launcher: a world of one process where every collective is a local
// copy, plus the frontend's argument checks and stats (no mpirun needed).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/error.h"
#include "runtime/core/profiler.h"
#include "runtime/ops/factory.h"

namespace mt::parallel {
namespace {

using runtime::DType;
using runtime::from_vector;

std::vector<double> values(int64_t n, double scale = 1.0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * double(i + 1);
  return v;
}

class LocalProcessGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (MpiProcessGroup::launched_by_launcher()) GTEST_SKIP() << "launched by mpirun/srun";
    pg = MpiProcessGroup::world();
  }
  std::unique_ptr<MpiProcessGroup> pg;
};

// srun without PMI (a site whose MpiDefault is none, no --mpi=pmix): SLURM's variables only. One
// task is a single-process run; several are refused before MPI_Init, naming the fix.
TEST(SrunWithoutPmi, OneTaskRunsAloneSeveralAreRefusedNamingMpiPmix) {
  if (MpiProcessGroup::launched_by_launcher()) GTEST_SKIP() << "launched by mpirun/srun";
  setenv("SLURM_PROCID", "1", 1);
  setenv("SLURM_STEP_NUM_TASKS", "1", 1);
  EXPECT_FALSE(MpiProcessGroup::launched_by_launcher());
  setenv("SLURM_STEP_NUM_TASKS", "4", 1);
  std::string message;
  try {
    (void)MpiProcessGroup::launched_by_launcher();
  } catch (const Error& e) {
    message = e.what();
  }
  unsetenv("SLURM_STEP_NUM_TASKS");
  unsetenv("SLURM_PROCID");
  EXPECT_THAT(message, ::testing::HasSubstr("srun started 4 tasks (this is task 1) without PMIx"));
  EXPECT_THAT(message, ::testing::HasSubstr("srun --mpi=pmix"));
}

// Collectives are ops of the op profiler (runtime/core/profiler.h), named by their kind.
TEST_F(LocalProcessGroupTest, CollectivesShowInTheOpProfiler) {
  Tensor t = from_vector(values(6), {2, 3}, {DType::F32});
  Tensor out = runtime::zeros({2, 3}, {DType::F32});
  runtime::Profiler::start(runtime::Device::cpu());
  pg->all_reduce(t, ReduceOp::Sum, "ar");
  pg->all_gather_into(out, t, "ag");
  const runtime::ProfileReport report = runtime::Profiler::stop();
  std::vector<std::string> top_level;
  for (const runtime::ProfiledOp& op : report.ops)
    if (op.depth == 0) top_level.push_back(op.name);
  EXPECT_EQ(top_level, (std::vector<std::string>{"all_reduce", "all_gather_into"}));
}

TEST_F(LocalProcessGroupTest, WorldIsOneProcess) {
  EXPECT_EQ(pg->rank(), 0);
  EXPECT_EQ(pg->size(), 1);
  EXPECT_EQ(pg->name(), "mpi:world");
  auto sub = pg->split(3, 0);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->name(), "mpi:world/split(3,0)");
}

TEST_F(LocalProcessGroupTest, CollectivesAreLocalCopies) {
  for (DType d : {DType::F32, DType::BF16, DType::F64}) {
    Tensor t = from_vector(values(6), {2, 3}, {d});
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      pg->all_reduce(t, op, "ar");
      EXPECT_EQ(t.to_vector<double>(), values(6)) << d << " " << reduce_op_name(op);
    }
    Tensor out = runtime::zeros({2, 3}, {d});
    pg->all_gather_into(out, t, "ag");
    EXPECT_EQ(out.to_vector<double>(), values(6));
    Tensor rs = runtime::zeros({2, 3}, {d});
    pg->reduce_scatter_into(rs, t, ReduceOp::Sum, "rs");
    EXPECT_EQ(rs.to_vector<double>(), values(6));
    pg->broadcast(t, 0, "bc");
    EXPECT_EQ(t.to_vector<double>(), values(6));
    Tensor a2a = runtime::zeros({2, 3}, {d});
    pg->all_to_all_single(a2a, t, {2}, {2}, "a2a");
    EXPECT_EQ(a2a.to_vector<double>(), values(6));
  }
  pg->barrier("barrier");
}

TEST_F(LocalProcessGroupTest, NonContiguousAndAsync) {
  Tensor base = from_vector(values(6), {2, 3}, {DType::F32});
  Tensor in = base.t();                                   // [3, 2], transposed view
  Tensor out = runtime::zeros({4, 3}, {DType::F32}).t();  // [3, 4] view, column-major
  Tensor out_rows = out.narrow(1, 0, 2);                  // non-contiguous [3, 2]
  pg->all_gather_into(out_rows, in, "ag", /*async_op=*/true).wait();
  EXPECT_EQ(out_rows.to_vector<double>(), in.to_vector<double>());
  Tensor t = from_vector(values(5), {5}, {DType::F32});
  Work w1 = pg->all_reduce(t, ReduceOp::Avg, "ar", /*async_op=*/true);
  Work w2 = pg->broadcast(t, 0, "bc", /*async_op=*/true);
  pg->all_reduce(t, ReduceOp::Max, "ar");  // sync, queued behind the async ones
  EXPECT_TRUE(w1.is_completed());
  w2.wait();
  EXPECT_EQ(t.to_vector<double>(), values(5));
}

TEST_F(LocalProcessGroupTest, StatsCountCallsAndBytes) {
  Tensor t = runtime::zeros({4, 8}, {DType::F32});
  pg->all_reduce(t, ReduceOp::Sum, "grad_sync");
  pg->all_reduce(t, ReduceOp::Sum, "grad_sync", true).wait();
  pg->broadcast(t, 0, "init");
  auto stats = pg->stats();
  ASSERT_EQ(stats.count("grad_sync"), 1u);
  EXPECT_EQ(stats["grad_sync"].calls, 2);
  EXPECT_EQ(stats["grad_sync"].bytes, 2 * 4 * 8 * 4);
  EXPECT_EQ(stats["grad_sync"].collective, "all_reduce");
  EXPECT_EQ(stats["init"].calls, 1);
  pg->reset_stats();
  EXPECT_TRUE(pg->stats().empty());
}

TEST_F(LocalProcessGroupTest, ArgumentErrorsThrow) {
  Tensor a = runtime::zeros({2, 3}, {DType::F32});
  Tensor b = runtime::zeros({3, 3}, {DType::F32});
  try {
    pg->all_gather_into(b, a, "ag");
    FAIL() << "expected mt::Error";
  } catch (const mt::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("all_gather_into"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mpi:world"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  }
  EXPECT_THROW(pg->all_gather_into(a, runtime::zeros({2, 3}, {DType::F64}), "ag"), mt::Error);
  EXPECT_THROW(pg->reduce_scatter_into(a, b, ReduceOp::Sum, "rs"), mt::Error);
  EXPECT_THROW(pg->all_reduce(runtime::zeros({2}, {DType::I64}), ReduceOp::Avg, "ar"), mt::Error);
  EXPECT_THROW(pg->all_reduce(runtime::zeros({2}, {DType::Bool}), ReduceOp::Sum, "ar"), mt::Error);
  EXPECT_THROW(pg->all_reduce(Tensor(), ReduceOp::Sum, "ar"), mt::Error);
  EXPECT_THROW(pg->broadcast(a, 1, "bc"), mt::Error);
  EXPECT_THROW(pg->send(a, 0, 0, "send"), mt::Error);  // no peer in a world of one
  EXPECT_THROW(pg->recv(a, 1, 0, "recv"), mt::Error);
  EXPECT_THROW(pg->all_to_all_single(a, a, {1}, {2}, "a2a"), mt::Error);     // out sum != 2
  EXPECT_THROW(pg->all_to_all_single(a, a, {2, 0}, {2}, "a2a"), mt::Error);  // wrong count
  EXPECT_THROW(pg->all_to_all_single(a, b, {2}, {3}, "a2a"), mt::Error);     // 2 != 3 rows
  EXPECT_THROW(set_max_message_elements(0), mt::Error);
}

}  // namespace
}  // namespace mt::parallel
