// The model a job (or a tool) builds: the registry's spec for its flavor, or the architecture a
// checkpoint saved.
//
// Every save keeps the model's architecture as /state/architecture (ModelSpec::architecture:
// for llama3 a Hugging Face config.json; `mt_checkpoint import-hf` writes the imported one), so
// that a model of any shape can be rebuilt from its checkpoint:
//   - `model.flavor = "from_checkpoint"` builds the architecture of the checkpoint the job loads
//     (initial_load_path, or the checkpoint it resumes);
//   - any other flavor must agree with that architecture in every field: a disagreement is an
//     error listing each differing field, never a silent load of other weights into it.
// Checkpoints written before the architecture was saved have none; they load as before (the
// tensors' shapes are still checked).
#pragma once

#include <any>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/state.h"
#include "models/llama/model_args.h"
#include "models/moe/model_args.h"
#include "models/registry.h"
#include "train/config/job_config.h"

namespace mt::train {

// The /state key of the architecture (checkpoints imported before it was named so keep
// "hf_config", read as well).
inline constexpr const char* kArchitectureValue = "architecture";

struct SavedArchitecture {
  std::string text;
  std::string where;  // e.g. "checkpoint out/checkpoint/step-10 /state/architecture", for errors
};

// The architecture saved in the checkpoint at `dir` (whose values are `values`), if any.
std::optional<SavedArchitecture> saved_architecture(const checkpoint::Values& values,
                                                    const std::filesystem::path& dir);
// The architecture of the checkpoint `job` starts from (train/checkpointer.h's
// checkpoint_to_load), if it saved one.
std::optional<SavedArchitecture> architecture_to_load(const config::JobConfig& job);

// The model's vocab for a tokenizer of `tokenizer_vocab` ids: that, padded up to a multiple of
// model.vocab_size_multiple_of (the ids past the tokenizer's are never inputs, targets or
// sampled: their logits only join the softmax's sum, and learn to stay low).
int64_t model_vocab_size(const config::JobConfig& job, int64_t tokenizer_vocab);

// The [model] moe_* keys the job sets (those not -1), as (key, value): MoE balancing over the
// flavor's values; for models without routed experts, an error.
std::vector<std::pair<std::string, double>> moe_balancing_overrides(const config::JobConfig& job);

// The spec for the job's model with the tokenizer's vocab (when given; padded as above), then
// `edit_args` (tests shrink a flavor), applied, the moe_* overrides above, and max_seq_len =
// training.seq_len: what the Trainer builds. With
// `saved`, the saved architecture (see above; its vocab must hold the tokenizer's ids, and
// `edit_args` is not applied to "from_checkpoint"); that flavor without one is an error.
models::ModelSpec model_spec_for(
    const config::JobConfig& job, std::optional<int64_t> vocab_size,
    const std::optional<SavedArchitecture>& saved = std::nullopt,
    const std::function<void(std::any& model_args)>& edit_args = nullptr);

// `fn` on the spec's args where they are a language model's (llama3, deepseek_v3: vocab_size,
// max_seq_len); nothing for other models. The args are shared (ModelSpec::args), so a const
// spec's are edited too.
template <class Fn>
void with_lm_args(const models::ModelSpec& spec, Fn&& fn) {
  if (auto* llama = std::any_cast<models::llama::ModelArgs>(spec.args.get())) {
    fn(*llama);
  } else if (auto* moe = std::any_cast<models::moe::ModelArgs>(spec.args.get())) {
    fn(*moe);
  }
}

// The vocab size and the longest sequence (max_seq_len) of a language model's spec (llama3,
// deepseek_v3); nullopt for other models.
std::optional<int64_t> vocab_size_of(const models::ModelSpec& spec);
std::optional<int64_t> max_seq_len_of(const models::ModelSpec& spec);

// `spec` (built from a flavor) checked against a saved architecture, then rebuilt from it: an
// mt::Error lists every field in which they differ, naming `config_what` (e.g. "model.flavor =
// \"debugmodel\"") and the checkpoint.
models::ModelSpec adopt_saved_architecture(const models::ModelSpec& spec,
                                           const SavedArchitecture& saved,
                                           const std::string& config_what);

}  // namespace mt::train
