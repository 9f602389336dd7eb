// The MoE model through the `train` loop on one process: aux-loss-free load balancing on real
// text (tinyshakespeare): the routing bias update brings the max / mean tokens-per-expert ratio
// down over training, and without it the ratio stays high.
#include <gtest/gtest.h>

#include <algorithm>
#include <any>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "models/moe/model_args.h"
#include "tests/testing/shared_data.h"
#include "tests/testing/trainer_fixtures.h"
#include "tests/testing/scratch_dir.h"
#include "train/config/load.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

// The mean of moe_load_imbalance over steps [from, to).
double mean_imbalance(const TrainResult& r, size_t from, size_t to) {
  double sum = 0;
  for (size_t i = from; i < to; ++i) sum += r.model_metrics.at(i).at("moe_load_imbalance");
  return sum / double(to - from);
}

TrainResult train_moe(const fs::path& corpus, double load_balance_coeff) {
  const testing::ScratchDir dump;
  const fs::path tokenizer = dump / "tokenizer";
  testing::save_small_tokenizer(corpus, tokenizer);
  const config::JobConfig cfg = config::load_config(
      fs::path(), {"--model.name=deepseek_v3", "--model.flavor=moe_debug",
                   "--job.dump_folder=" + dump.path().string(),
                   "--model.tokenizer_path=" + tokenizer.string(),
                   "--training.dataset_path=" + corpus.string(), "--training.local_batch_size=8",
                   "--training.seq_len=64", "--training.steps=80", "--training.seed=7",
                   "--training.mixed_precision_param=float32", "--optimizer.lr=3e-3",
                   "--lr_scheduler.warmup_steps=5", "--validation.enable=false"});
  TrainerOptions options;
  options.edit_model_args = [load_balance_coeff](std::any& args) {
    testing::shrink_moe(args);
    std::any_cast<models::moe::ModelArgs&>(args).load_balance_coeff = load_balance_coeff;
  };
  options.quiet = true;
  options.handle_signals = false;
  options.write_files = false;
  options.sample_tokens = 0;
  return Trainer(cfg, options).train();
}

// Untreated, the router collapses onto a few experts within ~20 steps (the ratio nears its
// maximum 8 / 2 = 4: every token on the same two experts) and stays there; with the bias update
// (coefficient 1e-2 here, to act within a short run) it peaks early, then falls back toward
// balance. Seen here (means of 5 steps): on 1.66, 1.79, ..., 3.14 (step 25), ..., 1.76 (steps
// 76-80); off 1.26, 1.33, 2.38, 3.76, 3.98, ..., 3.56.
TEST(MoeTrainer, LoadImbalanceFallsWithTheBiasUpdateAndStaysHighWithout) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const TrainResult on = train_moe(corpus, 1e-2), off = train_moe(corpus, 0.0);
  ASSERT_EQ(on.model_metrics.size(), 80u);
  ASSERT_EQ(off.model_metrics.size(), 80u);
  double on_peak = 0;
  std::cout << "moe_load_imbalance (max / mean tokens per expert), means of 5 steps, bias update "
               "on / off:\n";
  for (size_t i = 0; i < 80; i += 5) {
    on_peak = std::max(on_peak, mean_imbalance(on, i, i + 5));
    std::cout << "  steps " << i + 1 << "-" << i + 5 << ": " << mean_imbalance(on, i, i + 5)
              << " / " << mean_imbalance(off, i, i + 5) << "\n";
  }
  const double on_late = mean_imbalance(on, 70, 80), off_late = mean_imbalance(off, 70, 80);
  EXPECT_LT(on_late, on_peak - 0.5) << "the bias update did not bring the imbalance down";
  EXPECT_GT(off_late, 3.0) << "without the update the routing was expected to stay collapsed";
  EXPECT_LT(on_late, off_late - 1.0);
  EXPECT_LT(on.losses.back(), on.losses.front() - 0.5);  // and it still trains
}

}  // namespace
}  // namespace mt::train
