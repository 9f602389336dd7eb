#include "tests/testing/trainer_fixtures.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/bpe_trainer.h"
#include "checkpoint/safetensors.h"
#include "models/llama/hf_checkpoint.h"
#include "models/llama/model.h"
#include "models/llama/model_args.h"
#include "models/moe/model_args.h"

namespace mt::testing {

train::TrainerOptions quiet_trainer_options(std::function<void(std::any&)> edit,
                                            std::shared_ptr<parallel::ProcessGroup> world) {
  train::TrainerOptions options;
  options.edit_model_args = std::move(edit);
  options.quiet = true;
  options.handle_signals = false;
  options.write_files = false;
  options.sample_tokens = 0;
  options.world = std::move(world);
  return options;
}

void expect_same_run(const train::TrainResult& got, const train::TrainResult& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 2e-5 * want.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(got.grad_norms[i], want.grad_norms[i], 2e-5 * want.grad_norms[i])
        << "step " << i + 1;
  }
  ASSERT_EQ(got.val_losses.size(), want.val_losses.size());
  for (size_t i = 0; i < want.val_losses.size(); ++i) {
    EXPECT_EQ(got.val_losses[i].first, want.val_losses[i].first);
    EXPECT_NEAR(got.val_losses[i].second, want.val_losses[i].second, 2e-5);
  }
  // It trains (over the usual 10 steps; a shorter run checks its first updates only).
  if (want.losses.size() >= 10) {
    EXPECT_LT(want.losses.back(), want.losses.front() - 0.5);
  }
}

void expect_same_moe_run(const train::TrainResult& got, const train::TrainResult& want) {
  expect_same_run(got, want);
  if (::testing::Test::HasFatalFailure()) return;  // another number of steps
  ASSERT_EQ(got.model_metrics.size(), want.model_metrics.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    ASSERT_TRUE(want.model_metrics[i].count("moe_load_imbalance")) << "step " << i + 1;
    EXPECT_NEAR(got.model_metrics[i].at("moe_load_imbalance"),
                want.model_metrics[i].at("moe_load_imbalance"), 1e-9)
        << "step " << i + 1;
  }
}

std::vector<std::string> short_run_flags(const std::filesystem::path& corpus,
                                         const std::filesystem::path& tokenizer,
                                         const std::filesystem::path& dump, int64_t local_batch) {
  return {
      "--job.dump_folder=" + dump.string(),
      "--model.tokenizer_path=" + tokenizer.string(),
      "--training.dataset_path=" + corpus.string(),
      "--training.local_batch_size=" + std::to_string(local_batch),
      "--training.global_batch_size=8",
      "--training.seq_len=32",
      "--training.steps=10",
      "--training.seed=3",
      "--training.max_norm=0.5",
      "--training.mixed_precision_param=float32",
      "--optimizer.lr=1e-2",
      "--lr_scheduler.warmup_steps=1",
      "--validation.enable=true",
      "--validation.freq=5",
      "--validation.steps=2",
  };
}

void save_small_tokenizer(const std::filesystem::path& corpus, const std::filesystem::path& dir) {
  std::ifstream in(corpus, std::ios::binary);
  std::string text(200000, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(size_t(in.gcount()));
  data::BpeTrainer trainer({.vocab_size = 512});
  trainer.add_text(text);
  data::BpeTokenizer(trainer.train()).save(dir);
}

void shrink_llama(std::any& model_args) {
  auto& a = std::any_cast<models::llama::ModelArgs&>(model_args);
  a.dim = 64;
  a.n_layers = 2;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.multiple_of = 32;
}

void shrink_moe(std::any& model_args) {
  auto& a = std::any_cast<models::moe::ModelArgs&>(model_args);
  a.n_layers = 3;
  a.moe_inter_dim = 32;
}

models::llama::ModelArgs unusual_llama_args(int64_t vocab_size) {
  models::llama::ModelArgs a;
  a.dim = 96;
  a.n_layers = 3;
  a.n_heads = 6;
  a.n_kv_heads = 2;
  a.multiple_of = 32;
  a.vocab_size = vocab_size;
  a.norm_eps = 1e-6;
  a.rope_theta = 10000.0;
  a.rope_scaling = std::nullopt;
  a.tie_embeddings = true;
  a.max_position_embeddings = 256;
  a.max_seq_len = 256;
  return a;
}

void save_random_hf_llama(const models::llama::ModelArgs& args, uint64_t seed,
                          const std::filesystem::path& hf_dir) {
  models::llama::Weights ours;
  {
    models::llama::Transformer model(args, seed);
    for (const auto& [fqn, p] : model.named_parameters()) ours[fqn] = p.detach().clone();
  }
  checkpoint::write_safetensors_folder(hf_dir, models::llama::to_hf(ours, args), int64_t(1) << 32);
  std::ofstream(hf_dir / "config.json") << models::llama::hf_config_json(args, "float32");
}

}  // namespace mt::testing
