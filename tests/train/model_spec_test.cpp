// Models built from a checkpoint's saved architecture (train/model_spec.h): a Llama of a shape no
// flavor has (GQA 6/2, tied embeddings, eps 1e-6, no RoPE scaling, a padded vocab), imported
// from Hugging Face files, fine-tunes with model.flavor = "from_checkpoint" from the imported
// weights, saves its architecture with every checkpoint and resumes from it; a flavor that is
// not the checkpoint's model is an error listing every differing field, before any weight loads.
#include "train/model_spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/consolidate.h"
#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/index.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "models/llama/hf_checkpoint.h"
#include "runtime/core/error.h"
#include "tests/testing/errors.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/shared_data.h"
#include "tests/testing/trainer_fixtures.h"
#include "train/config/load.h"
#include "train/hf_conversion.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
namespace llama = models::llama;
using runtime::Tensor;
using testing::error_of;

fs::path import_random_model(const llama::ModelArgs& args, const fs::path& scratch) {
  testing::save_random_hf_llama(args, /*seed=*/11, scratch / "hf");
  import_hf(scratch / "hf", scratch / "imported" / "step-0");
  return scratch / "imported" / "step-0";
}

class FromCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto dir = testing::shared_data();
    if (!dir || !fs::exists(*dir / "tinyshakespeare.txt")) {
      GTEST_SKIP() << "shared data file tinyshakespeare.txt not found (set MT_SHARED_DATA)";
    }
    corpus_ = *dir / "tinyshakespeare.txt";
    testing::save_small_tokenizer(corpus_, scratch_ / "tokenizer");
    vocab_ = data::BpeTokenizer::from_file(scratch_ / "tokenizer").vocab_size();
    args_ = testing::unusual_llama_args(vocab_ + 24);  // padded, as Hugging Face vocabularies often are
    imported_ = import_random_model(args_, scratch_.path());
  }

  config::JobConfig job(const std::string& flavor, std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {
        "--job.dump_folder=" + (scratch_ / "run").string(),
        "--model.flavor=" + flavor,
        "--model.tokenizer_path=" + (scratch_ / "tokenizer").string(),
        "--training.dataset_path=" + corpus_.string(),
        "--training.local_batch_size=2",
        "--training.seq_len=32",
        "--training.steps=3",
        "--training.mixed_precision_param=float32",
        "--optimizer.lr=1e-3",
        "--lr_scheduler.warmup_steps=1",
        "--checkpoint.interval=3",
    };
    a.insert(a.end(), extra.begin(), extra.end());
    return config::load_config(fs::path(), a);
  }

  static TrainResult run(const config::JobConfig& cfg) {
    TrainerOptions options;
    options.quiet = true;
    options.handle_signals = false;
    options.write_files = false;
    options.sample_tokens = 0;
    return Trainer(cfg, options).train();
  }

  testing::ScratchDir scratch_;
  fs::path corpus_, imported_;
  int32_t vocab_ = 0;
  llama::ModelArgs args_;
};

TEST_F(FromCheckpoint, FineTunesAnImportedShapeAndKeepsItsArchitecture) {
  const TrainResult r = run(job("from_checkpoint", {"--checkpoint.initial_load_path=" +
                                                        imported_.string(),
                                                    "--checkpoint.enable=true"}));
  ASSERT_EQ(r.losses.size(), 3u);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));

  const fs::path step3 = scratch_ / "run" / "checkpoint" / "step-3";
  const checkpoint::Index index = checkpoint::read_index(step3 / checkpoint::kIndexFileName);
  const auto saved = saved_architecture(index.values, step3);
  ASSERT_TRUE(saved.has_value());
  const llama::ModelArgs back = llama::args_from_hf_config_text(saved->text, saved->where);
  EXPECT_TRUE(llama::architecture_differences(back, "saved", args_, "imported").empty());
  EXPECT_EQ(back.max_position_embeddings, 256);
  // One tied table, trained a little from the imported one (a fresh init differs by ~0.1).
  const Tensor before = checkpoint::read_whole_tensor(imported_, "model.tok_embeddings.weight");
  const Tensor after = checkpoint::read_whole_tensor(step3, "model.tok_embeddings.weight");
  double max_change = 0;
  const auto b = before.to_vector<float>(), a = after.to_vector<float>();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) max_change = std::max(max_change, double(std::abs(a[i] - b[i])));
  EXPECT_GT(max_change, 0.0);
  EXPECT_LT(max_change, 0.02);
  for (const checkpoint::IndexChunk& c : index.chunks) EXPECT_NE(c.meta.fqn, "model.output.weight");

  // Resuming builds the saved architecture again, with either flavor spelling the same model.
  const TrainResult resumed = run(job("from_checkpoint", {"--checkpoint.enable=true",
                                                          "--training.steps=4"}));
  EXPECT_EQ(resumed.first_step, 4);
  EXPECT_EQ(resumed.losses.size(), 1u);
}

TEST_F(FromCheckpoint, AFlavorThatIsNotTheCheckpointsModelListsEveryDifference) {
  const std::string e = error_of([&] {
    run(job("debugmodel", {"--checkpoint.initial_load_path=" + imported_.string()}));
  });
  for (const char* field :
       {"dim (hidden_size): 256 in the model asked for, 96 in the checkpoint",
        "n_layers (num_hidden_layers): 6 in the model asked for, 3 in",
        "n_heads (num_attention_heads): 16", "n_kv_heads (num_key_value_heads): 16",
        "ffn hidden size (intermediate_size)", "vocab_size: " , "norm_eps (rms_norm_eps): 1.0000000000000001e-05",
        "rope_theta: 500000", "rope_scaling: llama3 (factor 8", "tie_embeddings (tie_word_embeddings): false",
        "10 fields differ", "model.flavor = \"from_checkpoint\""}) {
    EXPECT_NE(e.find(field), std::string::npos) << field << "\n" << e;
  }
}

TEST_F(FromCheckpoint, NeedsACheckpointWithAnArchitectureAndAFittingSeqLen) {
  EXPECT_NE(error_of([&] { run(job("from_checkpoint")); }).find("initial_load_path"),
            std::string::npos);
  const std::string long_seq = error_of([&] {
    run(job("from_checkpoint", {"--checkpoint.initial_load_path=" + imported_.string(),
                                "--training.seq_len=512"}));
  });
  EXPECT_NE(long_seq.find("training.seq_len = 512"), std::string::npos) << long_seq;
  EXPECT_NE(long_seq.find("max_position_embeddings = 256"), std::string::npos) << long_seq;
  // The saved vocab (536) cannot be padded further: a padding it does not meet is an error
  // naming both, one it meets builds the model as saved.
  const std::string padding = error_of([&] {
    run(job("from_checkpoint", {"--checkpoint.initial_load_path=" + imported_.string(),
                                "--model.vocab_size_multiple_of=64"}));
  });
  for (const char* text : {"model.vocab_size_multiple_of = 64 (command-line flag",
                           "whose vocab_size 536 is not one"}) {
    EXPECT_NE(padding.find(text), std::string::npos) << text << "\n" << padding;
  }
  EXPECT_EQ(run(job("from_checkpoint", {"--checkpoint.initial_load_path=" + imported_.string(),
                                        "--model.vocab_size_multiple_of=8"}))
                .losses.size(),
            3u);
}

// A Llama checkpoint (an architecture saved) loaded by a job of a model that saves none: the
// error names both models, not every tensor whose shape or name differs.
TEST_F(FromCheckpoint, AnotherModelsCheckpointIsRefusedNamingBothModels) {
  const std::string e = error_of([&] {
    run(job("moe_debug", {"--model.name=deepseek_v3",
                          "--checkpoint.initial_load_path=" + imported_.string()}));
  });
  for (const char* text : {"(model.name = \"deepseek_v3\") cannot load checkpoint",
                           "it holds the architecture of another model (model_type \"llama\")"}) {
    EXPECT_NE(e.find(text), std::string::npos) << text << "\n" << e;
  }
}

TEST(ModelSpec, FromCheckpointIsRefusedForModelsThatSaveNoArchitecture) {
  const std::string e = error_of(
      [] { models::model_spec_from_architecture("deepseek_v3", "{}", "checkpoint x"); });
  EXPECT_NE(e.find("saves no architecture"), std::string::npos) << e;
  EXPECT_NE(e.find("moe_debug"), std::string::npos) << e;
}

}  // namespace
}  // namespace mt::train
