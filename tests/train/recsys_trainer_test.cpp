// The `train` loop for recommendation models (train/recsys_trainer.h) on one process: the shipped
// DLRM configs train to a useful held-out AUC (MovieLens 100K, synthetic Criteo-like data), the
// row_sparse mode clips the tables with the dense parameters, losses read at logged steps are
// every step's, bad configs get messages naming the key, and the `train` binary dispatches
// model.name = "dlrm" to this loop.
#include "train/recsys_trainer.h"

#include <gtest/gtest.h>

#include <any>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "models/dlrm/model_args.h"
#include "runtime/core/device_runtime.h"
#include "tests/testing/errors.h"
#include "tests/testing/run_command.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/shared_data.h"
#include "train/config/load.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

const fs::path kConfigs = fs::path(MT_SOURCE_DIR) / "configs";

config::JobConfig job(const std::string& file, const fs::path& dump,
                      std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--job.dump_folder=" + dump.string(), "--metrics.log_freq=1000"};
  args.insert(args.end(), extra.begin(), extra.end());
  return config::load_config(kConfigs / file, args);
}

TrainerOptions quiet() {
  TrainerOptions o;
  o.quiet = true;
  o.handle_signals = false;
  o.write_files = false;
  return o;
}

// configs/dlrm_movielens.toml as shipped, one epoch (350 steps of 256): held-out AUC > 0.75.
TEST(RecsysTrainer, MovieLensConfigReachesHeldOutAucAbove075) {
  REQUIRE_SHARED_FILE(ml, "ml-100k/u.data");
  testing::ScratchDir dir;
  const config::JobConfig c =
      job("dlrm_movielens.toml", dir.path(),
          {"--training.dataset_path=" + ml.parent_path().string(), "--training.steps=350"});
  RecsysTrainer trainer(c, quiet());
  const TrainResult r = trainer.train();
  ASSERT_EQ(r.losses.size(), 350u);
  ASSERT_EQ(r.val_aucs.size(), 1u);  // validation.freq = 350
  std::printf("MovieLens, 350 steps: loss %.4f -> %.4f, held-out BCE %.4f, AUC %.4f\n",
              r.losses.front(), r.losses.back(), r.val_losses.back().second,
              r.val_aucs.back().second);
  EXPECT_GT(r.val_aucs.back().second, 0.75);
  EXPECT_LT(r.val_losses.back().second, 0.60);
  EXPECT_NEAR(r.losses.front(), std::log(2.0), 0.05);  // a fresh model predicts ~0.5
  // evaluate() is what validation logged (same weights, same split).
  const HeldOutMetrics m = trainer.evaluate(-1);
  EXPECT_EQ(m.auc, std::optional<double>(r.val_aucs.back().second));
  EXPECT_EQ(m.samples, 10000);
}

// A held-out set of one class has no AUC: the run says so and goes on (it used to end there, before
// its final checkpoint).
TEST(RecsysTrainer, OneClassHeldOutSetHasNoAucAndTrainingGoesOn) {
  REQUIRE_SHARED_FILE(ml, "ml-100k/u.data");
  testing::ScratchDir dir;
  std::ostringstream log;
  TrainerOptions o = quiet();
  o.quiet = false;
  o.log = &log;
  RecsysTrainer trainer(job("dlrm_movielens.toml", dir.path(),
                            {"--training.dataset_path=" + ml.parent_path().string(),
                             "--training.steps=3", "--training.local_batch_size=1",
                             "--validation.steps=1", "--validation.freq=1"}),
                        o);
  const TrainResult r = trainer.train();
  EXPECT_EQ(r.losses.size(), 3u);
  EXPECT_EQ(r.val_losses.size(), 3u);
  EXPECT_TRUE(r.val_aucs.empty());
  EXPECT_NE(log.str().find("auc n/a (the held-out samples are all of one class)"),
            std::string::npos)
      << log.str();
}

// configs/dlrm_criteo_synthetic.toml: 100 steps learn the hidden logistic model.
TEST(RecsysTrainer, SyntheticCriteoConfigLearns) {
  testing::ScratchDir dir;
  const config::JobConfig c = job("dlrm_criteo_synthetic.toml", dir.path(),
                                  {"--training.steps=100", "--validation.freq=100"});
  const TrainResult r = RecsysTrainer(c, quiet()).train();
  ASSERT_EQ(r.val_aucs.size(), 1u);
  std::printf("synthetic Criteo, 100 steps: held-out AUC %.4f\n", r.val_aucs.back().second);
  EXPECT_GT(r.val_aucs.back().second, 0.75);
}

// row_sparse: the same first step as fused (same weights, same batch), but the total norm also
// counts the tables' row-sparse gradients, and a small max_norm clips them with the dense ones.
TEST(RecsysTrainer, RowSparseTablesAreInTheClippedNorm) {
  testing::ScratchDir dir;
  auto run = [&](const std::string& mode, double max_norm) {
    const config::JobConfig c =
        job("dlrm_criteo_synthetic.toml", dir.path(),
            {"--training.steps=5", "--lr_scheduler.warmup_steps=0", "--validation.enable=false",
             "--embedding.gradient_mode=" + mode, "--embedding.optimizer=sgd",
             "--training.max_norm=" + std::to_string(max_norm)});
    return RecsysTrainer(c, quiet()).train();
  };
  const TrainResult fused = run("fused", 100.0), sparse = run("row_sparse", 100.0);
  EXPECT_EQ(fused.losses[0], sparse.losses[0]);
  EXPECT_GT(sparse.grad_norms[0], fused.grad_norms[0] * (1 + 1e-5));  // the tables add ~0.006
  // Unclipped SGD rows: fused (in backward) and row_sparse (after backward) take the same steps.
  for (size_t i = 0; i < fused.losses.size(); ++i)
    EXPECT_NEAR(fused.losses[i], sparse.losses[i], 1e-5) << "step " << i + 1;
  // Clipped to a tenth of the first norm: training differs from step 2 on.
  const TrainResult clipped = run("row_sparse", sparse.grad_norms[0] / 10);
  EXPECT_EQ(clipped.grad_norms[0], sparse.grad_norms[0]);  // reported before clipping
  EXPECT_GT(std::abs(clipped.losses[1] - sparse.losses[1]), 1e-6);
}

// The host reads each step's loss and norm at logged steps only; every step's still arrive, in
// order, the same as when every step is logged (fused and row-sparse tables).
TEST(RecsysTrainer, LossesReadAtLoggedStepsAreEveryStepsLosses) {
  testing::ScratchDir dir;
  for (const std::string mode : {"fused", "row_sparse"}) {
    SCOPED_TRACE(mode);
    auto run = [&](int log_freq) {
      const config::JobConfig c =
          job("dlrm_criteo_synthetic.toml", dir.path(),
              {"--training.steps=7", "--lr_scheduler.warmup_steps=0", "--validation.enable=false",
               "--embedding.gradient_mode=" + mode,
               "--metrics.log_freq=" + std::to_string(log_freq)});
      return RecsysTrainer(c, quiet()).train();
    };
    const TrainResult each = run(1), logged = run(3);
    ASSERT_EQ(each.losses.size(), 7u);
    EXPECT_EQ(logged.losses, each.losses);
    EXPECT_EQ(logged.grad_norms, each.grad_norms);
    EXPECT_NE(each.losses[0], each.losses[6]);
  }
}

TEST(RecsysTrainer, BadConfigsNameTheKey) {
  testing::ScratchDir dir;
  auto error = [&](std::vector<std::string> extra) {
    return testing::error_of(
        [&] { RecsysTrainer(job("dlrm_criteo_synthetic.toml", dir.path(), extra), quiet()); });
  };
  EXPECT_NE(error({"--training.mixed_precision_param=bfloat16"}).find("mixed_precision_param"),
            std::string::npos);
  EXPECT_NE(error({"--training.dataset=criteo_tsv"}).find("movielens, synthetic_criteo"),
            std::string::npos);
  EXPECT_NE(error({"--training.dataset=movielens", "--training.dataset_path=/nonexistent/ml"})
                .find("/nonexistent/ml"),
            std::string::npos);
  EXPECT_NE(error({"--embedding.memory_budget_mb=1"}).find("t_cat_"), std::string::npos);
  EXPECT_NE(error({"--training.global_batch_size=1024"}).find("global_batch_size"),
            std::string::npos);
  EXPECT_NE(error({"--parallelism.tensor_parallel_degree=2"}).find("no tensor-parallel plan"),
            std::string::npos);
  EXPECT_NE(error({"--quantize.linear.float8.enable=true", "--quantize.linear.float8.emulate=true"})
                .find("float8 training is built for the transformer models"),
            std::string::npos);
  EXPECT_NE(error({"--embedding.managed_collision=[\"cat_0\", \"user\"]"}).find("'user'"),
            std::string::npos);
  EXPECT_NE(error({"--embedding.lookup_only=[\"cat_1\"]"}).find("embedding.managed_collision"),
            std::string::npos);
  // Refused on one rank too (it used to train there, table-wise, and fail only on several).
  EXPECT_NE(error({"--embedding.storage=kv", "--embedding.sharding=data_parallel"})
                .find("cannot hold kv-backed tables"),
            std::string::npos);
  // A flavor whose features are not the dataset's.
  REQUIRE_SHARED_FILE(ml, "ml-100k/u.data");
  EXPECT_NE(error({"--training.dataset=movielens",
                   "--training.dataset_path=" + ml.parent_path().string()})
                .find("criteo_small has 26 sparse features"),
            std::string::npos);
  // An unknown [embedding] value is refused when the config is read.
  EXPECT_NE(testing::error_of([&] {
              job("dlrm_criteo_synthetic.toml", dir.path(), {"--embedding.optimizer=lamb"});
            }).find("embedding.optimizer"),
            std::string::npos);
}

// Settings one process does not use are noted in the log, naming the key: a synthetic dataset
// reads no dataset_path, and one rank holds every table whole whatever embedding.sharding says.
TEST(RecsysTrainer, SettingsOneRankDoesNotUseAreNoted) {
  testing::ScratchDir dir;
  auto log_of = [&](std::vector<std::string> extra) {
    std::ostringstream log;
    TrainerOptions o = quiet();
    o.quiet = false;
    o.log = &log;
    extra.push_back("--training.steps=1");
    RecsysTrainer(job("dlrm_criteo_synthetic.toml", dir.path(), extra), o);
    return log.str();
  };
  const std::string plain = log_of({});
  EXPECT_EQ(plain.find("note:"), std::string::npos) << plain;
  const std::string path = log_of({"--training.dataset_path=/data/criteo"});
  EXPECT_NE(path.find("note: training.dataset_path = \"/data/criteo\" (command-line flag"),
            std::string::npos) << path;
  EXPECT_NE(path.find("is not read: dataset synthetic_criteo generates its batches"),
            std::string::npos) << path;
  const std::string sharding = log_of({"--embedding.sharding=row_wise"});
  EXPECT_NE(sharding.find("note: embedding.sharding = \"row_wise\" (command-line flag"),
            std::string::npos) << sharding;
  EXPECT_NE(sharding.find("takes effect on more than one rank"), std::string::npos) << sharding;
}

// Managed-collision ids on MovieLens: user and item ids hashed into their tables' rows (buckets
// overflow, so ids are evicted and rows reset), still learning; held-out batches leave the
// mapping as it was (evaluating twice gives the same AUC).
TEST(RecsysTrainer, ManagedCollisionIdsTrainAndEvaluateReadOnly) {
  REQUIRE_SHARED_FILE(ml, "ml-100k/u.data");
  testing::ScratchDir dir;
  const config::JobConfig c =
      job("dlrm_movielens.toml", dir.path(),
          {"--training.dataset_path=" + ml.parent_path().string(), "--training.steps=350",
           "--embedding.managed_collision=[\"user_id\", \"item_id\"]", "--metrics.log_freq=350"});
  std::ostringstream log;
  TrainerOptions o = quiet();
  o.quiet = false;
  o.log = &log;
  RecsysTrainer trainer(c, o);
  const TrainResult r = trainer.train();
  std::printf("MovieLens with managed-collision ids, 350 steps: AUC %.4f\n",
              r.val_aucs.back().second);
  EXPECT_GT(r.val_aucs.back().second, 0.74);
  EXPECT_NE(log.str().find("mc_evictions"), std::string::npos) << log.str();
  EXPECT_EQ(trainer.evaluate(-1).auc, std::optional<double>(r.val_aucs.back().second));
  EXPECT_EQ(trainer.evaluate(-1).auc, std::optional<double>(r.val_aucs.back().second));
}

// The binary: model.name = "dlrm" goes to this loop (exit 0, the AUC line); errors exit 1; a
// SIGINT stops it cleanly with a checkpoint.
TEST(RecsysTrainer, TrainBinaryRunsTheDlrmConfig) {
  testing::ScratchDir dir;
  const std::string base = std::string("OMP_NUM_THREADS=1 ") + MT_TRAIN_BIN + " --config " +
                           (kConfigs / "dlrm_criteo_synthetic.toml").string() +
                           " --job.dump_folder=" + dir.path().string();
  testing::CommandResult r =
      testing::run_command(base + " --training.steps=20 --validation.freq=20");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("held-out AUC"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("samples/s"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir.path() / "metrics.jsonl"));
  if (!runtime::cuda_is_available()) {  // with a GPU it trains: recsys_trainer_gpu_test
    r = testing::run_command(base + " --training.device=cuda 2>&1");
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find("training.device = \"cuda\""), std::string::npos) << r.output;
  }
  // Ctrl-C (SIGINT after 3 s) of a long run: it ends at the end of a step, saves a checkpoint
  // there and exits 0.
  r = testing::run_command("timeout --preserve-status -s INT 3 env " + base +
                           " --training.steps=100000 --validation.enable=false"
                           " --checkpoint.enable=true --checkpoint.interval=100000");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("stopped by SIGINT at the end of step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checkpoint: saved"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mt::train
