// Collective timeouts end the job with a report: runs comm_timeout_probe under mpirun (2 and 3
// ranks) where the last rank skips a collective, and checks that every rank exits non-zero within
// the timeout (plus launch slack) after printing which call, which group, and who did not arrive.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "runtime/core/error.h"
#include "tests/testing/run_command.h"
#include "tests/testing/shared_data.h"

#ifndef MT_MPIEXEC
#define MT_MPIEXEC ""
#define MT_TIMEOUT_PROBE ""
#define MT_TRAIN_BIN ""
#define MT_SOURCE_DIR ""
#endif

namespace mt {
namespace {

constexpr int kTimeoutMs = 2000;
constexpr double kSlackSeconds = 25;  // mpirun start and teardown on a busy 2-core machine

testing::CommandResult launch(int ranks, const std::string& scenario, int timeout_ms) {
  return testing::run_command(detail::concat(
      "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_rmaps_base_oversubscribe=1 ", MT_MPIEXEC,
      " --allow-run-as-root --oversubscribe -np ", ranks, " ", MT_TIMEOUT_PROBE, " ", scenario,
      " ", timeout_ms));
}

class CommTimeout : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(MT_MPIEXEC).empty()) GTEST_SKIP() << "no mpirun was found at configure time";
  }
  // The job failed, after at least the timeout and well before it would have without one.
  void expect_timed_out(const testing::CommandResult& r) {
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_GE(r.seconds, kTimeoutMs / 1000.0) << r.output;
    EXPECT_LT(r.seconds, kTimeoutMs / 1000.0 + kSlackSeconds) << r.output;
    EXPECT_EQ(r.output.find("which it should not"), std::string::npos) << r.output;
  }
};

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_F(CommTimeout, SkippedAllReduceNamesCallGroupAndMissingRank) {
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(ranks);
    testing::CommandResult r = launch(ranks, "skip", kTimeoutMs);
    expect_timed_out(r);
    const std::string last = std::to_string(ranks - 1);
    EXPECT_TRUE(contains(r.output, "collective timeout: all_reduce 'probe.skipped' (call #2 on "
                                   "group mpi:world"))
        << r.output;
    EXPECT_TRUE(contains(r.output, "did not complete within 2 s")) << r.output;
    EXPECT_TRUE(contains(r.output, "ranks that did not arrive: " + last + "\n")) << r.output;
    EXPECT_TRUE(contains(r.output, "rank " + last + ": call #1 all_reduce 'probe.warmup' "
                                   "(finished)"))
        << r.output;
    EXPECT_TRUE(contains(r.output, "Ending every rank of the job.")) << r.output;
  }
}

TEST_F(CommTimeout, AsyncCollectiveTimesOutToo) {
  testing::CommandResult r = launch(2, "skip_async", kTimeoutMs);
  expect_timed_out(r);
  EXPECT_TRUE(contains(r.output, "all_reduce 'probe.skipped'")) << r.output;
  EXPECT_TRUE(contains(r.output, "ranks that did not arrive: 1")) << r.output;
}

TEST_F(CommTimeout, SubgroupReportGivesGroupAndWorldRanks) {
  // 3 ranks: group {0, 2} (color 0); world rank 2 is rank 1 of it and skips.
  testing::CommandResult r = launch(3, "skip_split", kTimeoutMs);
  expect_timed_out(r);
  EXPECT_TRUE(contains(r.output, "on group mpi:world/split(0,0), rank 0 of 2)")) << r.output;
  EXPECT_TRUE(contains(r.output, "ranks that did not arrive: 1 (world rank 2)")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1: call #1 barrier 'probe.split_warmup' (finished)"))
      << r.output;
}

TEST_F(CommTimeout, RecvFromSilentPeer) {
  testing::CommandResult r = launch(2, "recv", kTimeoutMs);
  expect_timed_out(r);
  EXPECT_TRUE(contains(r.output, "collective timeout: recv 'probe.recv'")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1: call #1 all_reduce 'probe.warmup' (finished)"))
      << r.output;
}

TEST_F(CommTimeout, DeadRankEndsTheOthersWithoutWaitingForTheTimeout) {
  // Timeout 10 minutes: the launcher, not the timeout, must end the job.
  testing::CommandResult r = launch(3, "die", 600'000);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, kSlackSeconds) << r.output;
  EXPECT_EQ(r.output.find("which it should not"), std::string::npos) << r.output;
}

// A rank that fails on its own at start-up ends the job at once: its peer used to wait in a
// collective, and the failed rank in MPI_Finalize, until killed. The ranks share a config whose
// relative tokenizer path only the first rank's working directory holds (a rank-local failure
// the config check cannot see).
TEST_F(CommTimeout, ARankThatFailsAloneEndsTheJob) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  REQUIRE_SHARED_FILE(tokenizer, "gpt2/tokenizer.json");
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("mt_fail_alone_" + std::to_string(::getpid()));
  fs::create_directories(dir / "has" / "tok");
  fs::create_directories(dir / "lacks");
  fs::copy_file(tokenizer, dir / "has" / "tok" / "tokenizer.json");
  const std::string train = detail::concat(
      MT_TRAIN_BIN, " --config ", MT_SOURCE_DIR, "/configs/debug_model.toml --training.steps=2 ",
      "--training.seq_len=32 --validation.enable=false --job.dump_folder=", (dir / "run").string(),
      " --training.dataset_path=", corpus.string(), " --comm.timeout_seconds=600",
      " --model.tokenizer_path=tok/tokenizer.json");
  const testing::CommandResult r = testing::run_command(detail::concat(
      "OMP_NUM_THREADS=1 ", MT_MPIEXEC, " --allow-run-as-root --oversubscribe -np 1 -wdir ",
      (dir / "has").string(), " ", train, " : -np 1 -wdir ", (dir / "lacks").string(), " ",
      train));
  fs::remove_all(dir);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, kSlackSeconds) << r.output;  // not the 600 s timeout, nor forever
  EXPECT_TRUE(contains(r.output, "[rank 1] error: train: model.tokenizer_path "
                                 "tok/tokenizer.json does not exist"))
      << r.output;
}

}  // namespace
}  // namespace mt
