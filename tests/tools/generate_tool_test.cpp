// mt_generate end to end on checkpoints imported from Hugging Face files: the model comes from the
// checkpoint's saved architecture (a shape no flavor has, tied, with a padded vocab), --json
// gives the ids of the same greedy decoding run in process and --logits-out the prompt's logits;
// a --flavor that is not the checkpoint's model is an error listing the differing fields, and for
// checkpoints without a saved architecture the shapes are compared before a model is allocated;
// --model deepseek_v3 decodes a MoE checkpoint (its routing biases too) as the model does in
// process.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/consolidate.h"
#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/safetensors.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "models/llama/generate.h"
#include "models/decode.h"
#include "models/llama/model.h"
#include "models/moe/model_args.h"
#include "models/registry.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "tests/testing/run_command.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/shared_data.h"
#include "tests/testing/tensor_testing.h"
#include "tests/testing/trainer_fixtures.h"
#include "train/checkpointer.h"
#include "train/hf_conversion.h"

#ifndef MT_GENERATE_BIN
#define MT_GENERATE_BIN ""
#endif

namespace mt {
namespace {

namespace fs = std::filesystem;
namespace llama = models::llama;
using runtime::Tensor;

constexpr uint64_t kSeed = 5;

class GenerateTool : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(MT_GENERATE_BIN).empty()) GTEST_SKIP() << "mt_generate is not built";
    const auto dir = testing::shared_data();
    if (!dir || !fs::exists(*dir / "gpt2" / "tokenizer.json")) {
      GTEST_SKIP() << "shared data file gpt2/tokenizer.json not found (set MT_SHARED_DATA)";
    }
    tokenizer_ = *dir / "gpt2" / "tokenizer.json";
    args_ = testing::unusual_llama_args(50257 + 23);
    testing::save_random_hf_llama(args_, kSeed, scratch_ / "hf");
    train::import_hf(scratch_ / "hf", scratch_ / "imported" / "step-0");
  }

  // In a subshell, stdout redirected inside `flags` keeps stderr out of it.
  testing::CommandResult generate(const std::string& flags, bool subshell = false) const {
    const std::string command = std::string(MT_GENERATE_BIN) + " --tokenizer '" +
                                tokenizer_.string() + "' --checkpoint '" +
                                (scratch_ / "imported").string() + "' " + flags;
    return testing::run_command(subshell ? "{ " + command + "; }" : command);
  }

  testing::ScratchDir scratch_;
  fs::path tokenizer_;
  llama::ModelArgs args_;
};

TEST_F(GenerateTool, JsonIdsAndLogitsAreThoseOfTheImportedModel) {
  const fs::path logits_file = scratch_ / "logits.safetensors";
  const fs::path json_file = scratch_ / "out.json";
  const testing::CommandResult r =
      generate("--prompt 'ROMEO: what light' --max-new-tokens 12 --json --logits-out '" +
               logits_file.string() + "' > '" + json_file.string() + "'", /*subshell=*/true);
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream json_in(json_file);
  const nlohmann::json j = nlohmann::json::parse(json_in);
  const auto prompt = j.at("prompt_ids").get<std::vector<int64_t>>();
  const auto generated = j.at("generated_ids").get<std::vector<int64_t>>();

  const auto tokenizer = data::BpeTokenizer::from_file(tokenizer_);
  const std::vector<int32_t> encoded =
      tokenizer.encode("ROMEO: what light", tokenizer.bos_id().has_value());
  EXPECT_EQ(prompt, std::vector<int64_t>(encoded.begin(), encoded.end()));

  runtime::NoGradGuard no_grad;
  llama::ModelArgs args = args_;
  args.max_seq_len = 64;
  llama::Transformer model(args, kSeed);  // the weights the Hugging Face folder holds
  llama::GenerateOptions options;
  options.max_new_tokens = 12;
  options.eos_id = 50256;
  const llama::GenerateResult want = llama::generate(model, prompt, options);
  EXPECT_EQ(generated, want.tokens);
  EXPECT_EQ(j.at("stop_reason"), llama::stop_reason_name(want.stop_reason));

  const Tensor tokens =
      runtime::from_vector<int64_t>(prompt, {1, int64_t(prompt.size())}, {runtime::DType::I64});
  const Tensor expected = model(tokens).reshape({int64_t(prompt.size()), args.vocab_size});
  const Tensor logits = checkpoint::read_safetensors(logits_file).at("logits");
  EXPECT_TRUE(testing::all_close(logits, expected, 1e-6, 1e-6));
}

TEST_F(GenerateTool, AFlavorThatIsNotTheCheckpointsModelIsAnErrorListingTheFields) {
  const testing::CommandResult r = generate("--prompt hello --flavor debugmodel");
  EXPECT_EQ(r.status, 1) << r.output;
  for (const char* text : {"--flavor debugmodel with the tokenizer's vocab (50257) is not the model",
                           "dim (hidden_size): 256 in the model asked for, 96 in the checkpoint",
                           "vocab_size: 50257 in the model asked for, 50280 in",
                           "tie_embeddings (tie_word_embeddings): false"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;
  }
}

// RoPE and the KV cache cover --max-seq-len positions: more than the model was made for is refused
// (a million positions used to be allocated).
TEST_F(GenerateTool, MaxSeqLenBeyondTheModelsPositionsIsAnError) {
  const testing::CommandResult r = generate("--prompt hello --max-seq-len 1000000");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--max-seq-len 1000000 is more than the model's "
                          "max_position_embeddings"),
            std::string::npos)
      << r.output;
}

// A checkpoint saved before architectures were kept: --flavor builds the model, and one that does
// not fit is refused from the shapes alone, before the (here 8B) model is allocated.
TEST_F(GenerateTool, ShapesOfACheckpointWithoutArchitectureAreComparedBeforeBuilding) {
  checkpoint::CheckpointState state;
  for (const std::string name : {"tok_embeddings.weight", "norm.weight"}) {
    state.tensors.push_back(checkpoint::whole(
        "model." + name,
        checkpoint::read_whole_tensor(scratch_ / "imported" / "step-0", "model." + name)));
  }
  state.values["step"] = int64_t(0);
  auto world = parallel::MpiProcessGroup::world();
  checkpoint::save_checkpoint(scratch_ / "old" / "step-0", state, *world);
  const testing::CommandResult r = testing::run_command(
      std::string(MT_GENERATE_BIN) + " --tokenizer '" + tokenizer_.string() + "' --checkpoint '" +
      (scratch_ / "old").string() + "' --prompt hello --flavor 8B");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--flavor 8B is not the model saved in"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.tok_embeddings.weight: [50280, 96] in the checkpoint, "
                          "[50257, 4096] in the model"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("model.layers.0.attention.wq.weight: not in the checkpoint"),
            std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 30.0) << "the 8B model was built before the shapes were compared";
}

// --model deepseek_v3: a MoE checkpoint (saved without an architecture) with --flavor
// moe_debug and the tokenizer's vocab; the ids of the same greedy and sampled decoding run in
// process with the MoE model's KV-cached forward, and its prompt logits.
TEST_F(GenerateTool, MoeCheckpointDecodesAsTheModelInProcess) {
  const models::ModelSpec spec = models::get_model_spec("deepseek_v3", "moe_debug");
  std::any_cast<models::moe::ModelArgs&>(*spec.args).vocab_size = 50257;
  std::any_cast<models::moe::ModelArgs&>(*spec.args).max_seq_len = 64;
  const auto model = spec.build({.seed = 9});
  // Saved as the trainer saves it: the parameters and the routing biases (buffers), which are
  // set far from their initial zeros so that decoding without them routes other experts.
  checkpoint::CheckpointState state;
  for (const auto& [fqn, p] : model->named_parameters())
    state.tensors.push_back(checkpoint::whole("model." + fqn, p.detach()));
  const std::vector<std::pair<std::string, Tensor>> buffers = train::persistent_buffers(*model);
  ASSERT_EQ(buffers.size(), 3u);  // the expert_bias of each MoE layer
  for (const auto& [fqn, buffer] : buffers) {
    EXPECT_TRUE(fqn.ends_with(".moe.expert_bias")) << fqn;
    buffer.copy_(runtime::randn(buffer.shape(), runtime::RandomKey(11, fqn)) * 10.0);
    state.tensors.push_back(checkpoint::whole("model." + fqn, buffer.detach()));
  }
  state.values["step"] = int64_t(0);
  auto world = parallel::MpiProcessGroup::world();
  checkpoint::save_checkpoint(scratch_ / "moe" / "step-0", state, *world);

  const auto tokenizer = data::BpeTokenizer::from_file(tokenizer_);
  const std::vector<int32_t> encoded = tokenizer.encode("ROMEO: what light", true);
  const std::vector<int64_t> prompt(encoded.begin(), encoded.end());
  for (const double temperature : {0.0, 1.0}) {
    SCOPED_TRACE(temperature);
    const fs::path json_file = scratch_ / "moe.json", logits_file = scratch_ / "moe.safetensors";
    const testing::CommandResult r = testing::run_command(
        "{ " + std::string(MT_GENERATE_BIN) + " --tokenizer '" + tokenizer_.string() +
        "' --checkpoint '" + (scratch_ / "moe").string() +
        "' --model deepseek_v3 --prompt 'ROMEO: what light' --max-new-tokens 12 --max-seq-len 64 "
        "--seed 3 --top-k 20 --temperature " + std::to_string(temperature) + " --json --logits-out '" +
        logits_file.string() + "' > '" + json_file.string() + "'; }");
    ASSERT_EQ(r.status, 0) << r.output;
    std::ifstream json_in(json_file);
    const nlohmann::json j = nlohmann::json::parse(json_in);
    EXPECT_EQ(j.at("prompt_ids").get<std::vector<int64_t>>(), prompt);
    llama::GenerateOptions options{.max_new_tokens = 12, .temperature = temperature,
                                   .top_k = 20, .seed = 3};
    options.eos_id = 50256;
    const llama::GenerateResult want = models::generate(spec, *model, {50257, 64}, prompt, options);
    EXPECT_EQ(j.at("generated_ids").get<std::vector<int64_t>>(), want.tokens);
    EXPECT_EQ(want.tokens.size(), 12u);
    runtime::NoGradGuard no_grad;
    const Tensor tokens =
        runtime::from_vector<int64_t>(prompt, {1, int64_t(prompt.size())}, {runtime::DType::I64});
    const Tensor expected =
        spec.forward(*model, tokens).reshape({int64_t(prompt.size()), int64_t(50257)});
    EXPECT_TRUE(testing::all_close(checkpoint::read_safetensors(logits_file).at("logits"),
                                   expected, 1e-6, 1e-6));
  }
  // A flavor whose shapes are not the checkpoint's is refused before it is built.
  const testing::CommandResult bad = testing::run_command(
      std::string(MT_GENERATE_BIN) + " --tokenizer '" + tokenizer_.string() + "' --checkpoint '" +
      (scratch_ / "moe").string() + "' --model deepseek_v3 --flavor 16B --prompt hello");
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find("--flavor 16B is not the model saved in"), std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace mt
