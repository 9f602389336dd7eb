// The job's model spec and the architectures checkpoints save (see model_spec.h).
#include "train/model_spec.h"

#include <nlohmann/json.hpp>

#include "checkpoint/index.h"
#include "checkpoint/manager.h"
#include "models/llama/model_args.h"
#include "models/moe/model_args.h"
#include "runtime/core/error.h"
#include "train/checkpointer.h"

namespace mt::train {

namespace fs = std::filesystem;

std::optional<int64_t> vocab_size_of(const models::ModelSpec& spec) {
  std::optional<int64_t> vocab;
  with_lm_args(spec, [&](auto& args) { vocab = args.vocab_size; });
  return vocab;
}

int64_t model_vocab_size(const config::JobConfig& job, int64_t tokenizer_vocab) {
  const int64_t multiple = job.model.vocab_size_multiple_of;
  MT_CHECK(multiple > 0, "model.vocab_size_multiple_of = ", multiple, " (",
           job.where("model.vocab_size_multiple_of"), ") must be positive");
  return (tokenizer_vocab + multiple - 1) / multiple * multiple;
}

std::optional<int64_t> max_seq_len_of(const models::ModelSpec& spec) {
  std::optional<int64_t> max_seq_len;
  with_lm_args(spec, [&](auto& args) { max_seq_len = args.max_seq_len; });
  return max_seq_len;
}

std::optional<SavedArchitecture> saved_architecture(const checkpoint::Values& values,
                                                    const fs::path& dir) {
  for (const char* key : {kArchitectureValue, "hf_config"}) {
    auto it = values.find(key);
    if (it == values.end()) continue;
    MT_CHECK(std::holds_alternative<std::string>(it->second), "checkpoint ", dir.string(),
             ": /state/", key, " is not a string");
    return SavedArchitecture{std::get<std::string>(it->second),
                             "checkpoint " + dir.string() + " /state/" + key};
  }
  return std::nullopt;
}

std::optional<SavedArchitecture> architecture_to_load(const config::JobConfig& job) {
  const CheckpointToLoad load = checkpoint_to_load(job);
  if (load.dir.empty()) return std::nullopt;
  const checkpoint::Index index = checkpoint::read_index(load.dir / checkpoint::kIndexFileName);
  return saved_architecture(index.values, load.dir);
}

namespace {
// The Hugging Face model_type an architecture text (a config.json) names, or what it is not.
std::string saved_model_type(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("model_type") && j["model_type"].is_string())
    return "model_type \"" + j["model_type"].get<std::string>() + "\"";
  return "not a config.json with a model_type";
}
}  // namespace

models::ModelSpec adopt_saved_architecture(const models::ModelSpec& spec,
                                           const SavedArchitecture& saved,
                                           const std::string& config_what) {
  if (!spec.architecture_differences) {  // this model saves none: shapes are checked
    // An architecture in the checkpoint comes from a model that saves one: not this one.
    MT_FAIL(config_what, " (model.name = \"", spec.name, "\") cannot load ", saved.where,
            ": it holds the architecture of another model (",
            saved_model_type(saved.text), "); set model.name to the model that saved it");
  }
  const std::vector<std::string> differences =
      spec.architecture_differences(saved.text, saved.where);
  if (!differences.empty()) {
    std::string list;
    for (const std::string& d : differences) list += "\n  " + d;
    MT_FAIL(config_what, " is not the model saved in ", saved.where, " (", differences.size(),
            differences.size() == 1 ? " field differs" : " fields differ", "):", list,
            "\nset model.flavor = \"", models::kFlavorFromCheckpoint,
            "\" to build the checkpoint's architecture (mt_generate: leave out --flavor)");
  }
  models::ModelSpec adopted =
      models::model_spec_from_architecture(spec.name, saved.text, saved.where);
  adopted.flavor = spec.flavor;
  return adopted;
}

std::vector<std::pair<std::string, double>> moe_balancing_overrides(const config::JobConfig& job) {
  std::vector<std::pair<std::string, double>> set;
  if (job.model.moe_aux_loss_alpha >= 0)
    set.emplace_back("model.moe_aux_loss_alpha", job.model.moe_aux_loss_alpha);
  if (job.model.moe_load_balance_coeff >= 0)
    set.emplace_back("model.moe_load_balance_coeff", job.model.moe_load_balance_coeff);
  return set;
}

namespace {
// The overrides over the flavor's (or checkpoint's) values; on a model without routed experts
// they are an error (they would do nothing).
void apply_moe_balancing(const config::JobConfig& job, models::ModelSpec& spec) {
  auto* moe = std::any_cast<models::moe::ModelArgs>(spec.args.get());
  for (const auto& [key, value] : moe_balancing_overrides(job)) {
    MT_CHECK(moe != nullptr, key, " = ", value, " (", job.where(key), ") applies to MoE models ",
             "(deepseek_v3); model.name = \"", job.model.name, "\" has no routed experts");
    if (key == "model.moe_aux_loss_alpha") moe->aux_loss_alpha = value;
    if (key == "model.moe_load_balance_coeff") moe->load_balance_coeff = value;
  }
}
}  // namespace

models::ModelSpec model_spec_for(const config::JobConfig& job, std::optional<int64_t> vocab_size,
                                 const std::optional<SavedArchitecture>& saved,
                                 const std::function<void(std::any& model_args)>& edit_args) {
  models::ModelSpec spec;
  if (job.model.flavor == models::kFlavorFromCheckpoint) {
    MT_CHECK(saved.has_value(), "model.flavor = \"", models::kFlavorFromCheckpoint, "\" (",
             job.where("model.flavor"), ") builds the architecture saved in the checkpoint the job loads, but it loads "
             "none that saved one: set [checkpoint] initial_load_path to a checkpoint written by "
             "`mt_checkpoint import-hf` or by train");
    spec = models::model_spec_from_architecture(job.model.name, saved->text, saved->where);
    const int64_t multiple = job.model.vocab_size_multiple_of;
    with_lm_args(spec, [&](auto& args) {
      MT_CHECK(!vocab_size || *vocab_size <= args.vocab_size, "the tokenizer ",
               job.model.tokenizer_path, " has ", vocab_size.value_or(0),
               " tokens, more than the vocab_size ", args.vocab_size, " of the model in ",
               saved->where);
      // The saved vocab is the model's: padding cannot change it, so a padding it lacks is
      // refused rather than ignored.
      MT_CHECK(args.vocab_size % multiple == 0, "model.vocab_size_multiple_of = ", multiple, " (",
               job.where("model.vocab_size_multiple_of"), ") asks for a vocab padded to a ",
               "multiple of ", multiple, ", but model.flavor = \"", models::kFlavorFromCheckpoint,
               "\" builds the model in ", saved->where, ", whose vocab_size ", args.vocab_size,
               " is not one: leave vocab_size_multiple_of at 1 to train it as saved");
    });
  } else {
    spec = models::get_model_spec(job.model.name, job.model.flavor);
    with_lm_args(spec, [&](auto& args) {
      if (vocab_size) args.vocab_size = model_vocab_size(job, *vocab_size);
    });
    if (edit_args) edit_args(*spec.args);
    if (saved) {
      spec = adopt_saved_architecture(
          spec, *saved,
          "model.flavor = \"" + job.model.flavor + "\"" +
              (vocab_size ? " with the tokenizer's vocab (" + std::to_string(*vocab_size) +
                                (job.model.vocab_size_multiple_of > 1
                                     ? ", padded to " + std::to_string(model_vocab_size(job, *vocab_size))
                                     : std::string()) +
                                ")"
                          : std::string()));
    }
  }
  with_lm_args(spec, [&](auto& args) { args.max_seq_len = job.training.seq_len; });
  apply_moe_balancing(job, spec);
  if (auto* args = std::any_cast<models::llama::ModelArgs>(spec.args.get())) {
    MT_CHECK(job.training.seq_len <= args->max_position_embeddings,
             "training.seq_len = ", job.training.seq_len, " (", job.where("training.seq_len"),
             ") is longer than the model's context, max_position_embeddings = ",
             args->max_position_embeddings);
  }
  return spec;
}

}  // namespace mt::train
