// The recsys `train` loop on real ranks (mpirun -np 2 and -np 4): DLRM with sharded tables and
// FSDP dense layers trains like one process over the same global batches (losses, norms and the
// held-out AUC to float tolerance), for the planner's plan and for every table forced to one
// sharding type, and table_row_wise over the job's nodes; a checkpoint saved on every rank resumes
// on fewer ranks with other plans.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/comm/mpi_process_group.h"
#include "tests/testing/mpi_fixtures.h"
#include "train/config/load.h"
#include "train/recsys_trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
using parallel::ProcessGroup;

constexpr int64_t kGlobalBatch = 256;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(parallel::MpiProcessGroup::world());
  return pg;
}

// configs/dlrm_criteo_synthetic.toml, short: `ranks` ranks of kGlobalBatch / ranks samples.
config::JobConfig job(int64_t ranks, const fs::path& dump, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {
      "--job.dump_folder=" + dump.string(),
      "--training.local_batch_size=" + std::to_string(kGlobalBatch / ranks),
      "--training.steps=20",
      "--lr_scheduler.warmup_steps=5",
      "--validation.freq=20",
      "--validation.steps=10",
      "--metrics.log_freq=1000",
  };
  args.insert(args.end(), extra.begin(), extra.end());
  return config::load_config(fs::path(MT_SOURCE_DIR) / "configs" / "dlrm_criteo_synthetic.toml",
                             args);
}

TrainResult run(const config::JobConfig& c, std::shared_ptr<ProcessGroup> group,
               std::ostream* log = nullptr) {
  TrainerOptions o;
  o.quiet = log == nullptr;
  o.log = log;
  o.handle_signals = false;
  o.write_files = false;
  o.world = std::move(group);
  return RecsysTrainer(c, o).train();
}

void expect_close(const TrainResult& sharded, const TrainResult& single) {
  ASSERT_EQ(sharded.losses.size(), single.losses.size());
  for (size_t i = 0; i < single.losses.size(); ++i) {
    // float32 training: the dense gradients are summed in another order (FSDP's reduce-scatter),
    // and the difference grows step by step (~1e-7 at step 1, ~3e-5 by step 30).
    EXPECT_NEAR(sharded.losses[i], single.losses[i], 1e-4 * std::abs(single.losses[i]))
        << "step " << i + 1;
    EXPECT_NEAR(sharded.grad_norms[i], single.grad_norms[i], 3e-3 * single.grad_norms[i])
        << "step " << i + 1;
  }
  ASSERT_EQ(sharded.val_aucs.size(), 1u);
  ASSERT_EQ(single.val_aucs.size(), 1u);
  EXPECT_NEAR(sharded.val_aucs[0].second, single.val_aucs[0].second, 5e-4);
  EXPECT_NEAR(sharded.val_losses[0].second, single.val_losses[0].second, 5e-4);
}

class RecsysTrainerMpi : public ::testing::TestWithParam<std::string> {};

// One process (this rank alone, the whole global batch) against every rank together.
TEST_P(RecsysTrainerMpi, ShardedRunTracksOneProcess) {
  const int64_t n = world()->size();
  const fs::path dump = testing::shared_dir(*world(), "mt_recsys_trainer_mpi", GetParam());
  std::vector<std::string> extra = {"--embedding.sharding=" + GetParam()};
  // auto: also row-sparse table gradients, clipped with the dense ones, and managed-collision
  // ids sharded by buckets. column_wise: exact SGD,
  // since row-wise Adagrad keeps its per-row state per column shard (as TorchRec's does), which
  // one process (a single shard) cannot reproduce.
  if (GetParam() == "auto") {  // + managed-collision ids (evictions) on two features
    extra.push_back("--embedding.gradient_mode=row_sparse");
    extra.push_back("--embedding.managed_collision=[\"cat_0\", \"cat_5\"]");
  }
  if (GetParam() == "column_wise") extra.push_back("--embedding.optimizer=sgd");
  std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
  const TrainResult single =
      run(job(1, dump / ("single" + std::to_string(world()->rank())), extra), self);
  const TrainResult sharded = run(job(n, dump / "sharded", extra), world());
  expect_close(sharded, single);
  EXPECT_GT(sharded.val_aucs[0].second, 0.6);  // learning (20 steps)
  if (world()->rank() == 0) {
    std::printf("%s on %lld ranks: loss %.5f (1 process %.5f), AUC %.4f (1 process %.4f)\n",
                GetParam().c_str(), static_cast<long long>(n), sharded.losses.back(),
                single.losses.back(), sharded.val_aucs[0].second, single.val_aucs[0].second);
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, RecsysTrainerMpi,
                         ::testing::Values("auto", "table_wise", "row_wise", "column_wise",
                                           "data_parallel"),
                         [](const auto& info) { return info.param; });

// The job's nodes reach the embedding planner (train/launch_layout.h): ranks in pairs on nodes
// that SLURMD_NODENAME names (2 nodes x 2 ranks on 4 ranks), every table table_row_wise (its rows
// over the ranks of each node, the pooled partial sums reduced inside the node, one block per
// node): the plan says which nodes it planned for, and the run tracks one process.
TEST(RecsysTrainerMpiNodes, TableRowWiseOverTheJobsNodesTracksOneProcess) {
  const int64_t n = world()->size();
  const fs::path dump = testing::shared_dir(*world(), "mt_recsys_trainer_mpi", "nodes");
  const std::vector<std::string> extra = {"--embedding.sharding=table_row_wise"};
  std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
  const TrainResult single =
      run(job(1, dump / ("single" + std::to_string(world()->rank())), extra), self);
  setenv("SLURMD_NODENAME", ("node" + std::to_string(world()->rank() / 2)).c_str(), 1);
  std::ostringstream log;
  const TrainResult sharded = run(job(n, dump / "sharded", extra), world(), &log);
  unsetenv("SLURMD_NODENAME");
  expect_close(sharded, single);
  if (world()->rank() == 0) {
    const std::string nodes = n / 2 == 1 ? "1 node" : std::to_string(n / 2) + " nodes";
    EXPECT_NE(log.str().find("sharding plan (world size " + std::to_string(n) + ": " + nodes +
                             ", 2 ranks per node"),
              std::string::npos)
        << log.str();
    EXPECT_NE(log.str().find("node node0: ranks 0-1 (local 0-1)"), std::string::npos)
        << log.str();
    EXPECT_NE(log.str().find("table_row_wise"), std::string::npos) << log.str();
  }
}

// A checkpoint saved by every rank (the planner's plan) resumes on fewer ranks with other plans
// (every table row_wise on half the ranks, everything on one rank): the same steps 11-20 as the
// uninterrupted run, since the tables, their row-optimizer state, the managed-collision mapping,
// the dense parameters, AdamW and the data position are all restored in global coordinates.
TEST(RecsysTrainerMpiCheckpoint, SavedOnAllRanksResumesOnFewer) {
  const int64_t n = world()->size();
  const fs::path dir = testing::shared_dir(*world(), "mt_recsys_trainer_mpi", "checkpoint");
  const std::vector<std::string> ckpt = {"--training.steps=20", "--checkpoint.enable=true",
                                         "--checkpoint.interval=10", "--validation.enable=false",
                                         "--embedding.managed_collision=[\"cat_0\", \"cat_5\"]"};
  const TrainResult straight = run(job(n, dir / "straight", ckpt), world());
  ASSERT_EQ(straight.losses.size(), 20u);
  std::vector<int64_t> counts = {n / 2};
  if (n / 2 > 1) counts.push_back(1);
  for (int64_t ranks : counts) {
    SCOPED_TRACE(std::to_string(ranks) + " rank(s)");
    const bool member = world()->rank() < ranks;
    std::shared_ptr<ProcessGroup> sub = world()->split(member ? 0 : 1, world()->rank());
    const fs::path dump = dir / ("resumed_on_" + std::to_string(ranks));
    if (world()->rank() == 0) {  // a new run folder holding only the step-10 checkpoint
      fs::create_directories(dump / "checkpoint");
      fs::copy(dir / "straight" / "checkpoint" / "step-10", dump / "checkpoint" / "step-10",
               fs::copy_options::recursive);
    }
    world()->barrier("copied");
    if (!member) continue;
    std::vector<std::string> extra = ckpt;
    if (ranks > 1) extra.push_back("--embedding.sharding=row_wise");
    const TrainResult resumed = run(job(ranks, dump, extra), sub);
    ASSERT_EQ(resumed.first_step, 11);
    ASSERT_EQ(resumed.losses.size(), 10u);
    for (size_t i = 0; i < 10; ++i) {
      EXPECT_NEAR(resumed.losses[i], straight.losses[10 + i], 1e-5 * straight.losses[10 + i])
          << "step " << 11 + i;
    }
  }
}

}  // namespace
}  // namespace mt::train
