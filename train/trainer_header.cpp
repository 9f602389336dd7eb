// The lines a run's log opens with (Trainer::log_run_header): the job, model, data, steps,
// device and parallelism, as a user checks them before the first step.
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>

#include "data/dataset/loader.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/core/device_runtime.h"
#include "train/config/validate.h"
#include "train/float8_setup.h"
#include "train/metrics/peak_flops.h"
#include "train/model_spec.h"
#include "train/run_scaffold.h"
#include "train/trainer.h"

namespace mt::train {

bool Trainer::computes_in_bf16() const {
  return dp_mesh_ != nullptr && config_.training.mixed_precision_param != "float32";
}

std::optional<double> Trainer::mfu_peak_flops() const {
  const std::string device_name =
      device_.is_cuda() ? runtime::device_runtime(device_.type)->device_name(device_.index) : "";
  return peak_flops(device_.type, device_name,
                    computes_in_bf16() ? PeakDType::BF16 : PeakDType::F32);
}

std::string Trainer::activation_checkpointing_text() const {
  const config::ActivationCheckpointConfig& ac = config_.activation_checkpoint;
  int64_t recomputed = 0;
  for (const auto& [name, module] : model_->named_modules())
    recomputed += module->activation_checkpointing();
  std::string what = ac.mode;
  if (ac.mode == "selective") {
    const std::string& n = ac.selective_ac_option;
    what += n == "op" ? " by op, keeping attention and every other matmul output"
                      : ", every " + n + (n == "1" ? " block" : " blocks");
  }
  return what + " (" + std::to_string(recomputed) + " block" + (recomputed == 1 ? "" : "s") +
         " recomputed in backward)";
}

void Trainer::log_run_header(std::ostream& out, int64_t tokens_per_step, double flops_per_token,
                             const std::optional<double>& peak) const {
  const auto& tc = config_.training;
  // A model's vocab may be padded beyond the tokenizer's (e.g. an imported Hugging Face model).
  const auto vocab_text = [&] {
    const int64_t model = vocab_size_of(*spec_).value_or(tokenizer_->vocab_size());
    return model == tokenizer_->vocab_size() ? std::to_string(model)
                                             : std::to_string(model) + " (the tokenizer's " +
                                                   std::to_string(tokenizer_->vocab_size()) + ")";
  };
  out << "job: " << config_.job.description << " -> " << config_.job.dump_folder << "\n"
      << "model: " << config_.model.name << " " << config_.model.flavor << ", " << num_params()
      << " parameters, vocab " << vocab_text() << ", " << std::setprecision(3)
      << flops_per_token / 1e6
      << " MFLOPs/token; activation checkpointing: " << activation_checkpointing_text() << "\n"
      << (float8_text_.empty() ? "" : float8_text_ + "\n") << "data: " << token_file_.string()
      << ": " << loader_->info().num_tokens << " tokens, " << loader_->num_train_windows()
      << " training + " << loader_->num_val_windows() << " validation windows of " << tc.seq_len
      << "\n"
      << "steps: " << tc.steps << " x " << grad_accum_ << " micro-batch(es) of "
      << tc.local_batch_size << " x " << tc.seq_len / cp_ << " tokens per rank"
      << (cp_ > 1 ? " (1/" + std::to_string(cp_) + " of " + std::to_string(tc.seq_len) +
                        "-token sequences)"
                  : std::string())
      << " (" << tokens_per_step * (world_size() / ranks_per_batch()) << " tokens/step on "
      << world_size() << " rank" << (world_size() > 1 ? "s" : "") << ", global batch "
      << global_batch_size_ << "); " << config_.optimizer.name << " lr " << config_.optimizer.lr
      << "; seed " << tc.seed << "; " << cpu_threads_text() << "\n"
      << placement_text_ << std::flush;
  if (device_.is_cuda()) {  // which peak the MFU column is measured against
    std::ostringstream peak_text;
    if (peak) {
      peak_text << std::fixed << std::setprecision(0) << *peak / 1e12 << " TFLOP/s ("
                << (computes_in_bf16() ? "bfloat16" : "float32") << " dense, per GPU)";
    } else {
      peak_text << "unknown for this GPU (MFU n/a)";
    }
    out << "device: " << runtime::device_description(device_) << "; MFU peak " << peak_text.str()
        << "\n";
  }
  if (dp_mesh_ || pp_ > 1) {
    const config::WorldLayout layout = config::validate_for_world(config_, world_size());
    out << "parallelism: " << world_size() << " rank" << (world_size() > 1 ? "s" : "")
        << ": dp_replicate " << layout.dp_replicate << " x dp_shard " << layout.dp_shard << ", ep "
        << layout.ep << (layout.ep > 1 ? " (experts over " + expert_mesh_->describe() + ")" : "")
        << ", cp " << layout.cp << ", tp " << layout.tp << ", pp " << layout.pp
        << (layout.pp > 1
                ? " (" + config_.parallelism.pipeline_parallel_schedule + ", " +
                      std::to_string(layout.microbatches) + " micro-batches of " +
                      std::to_string(config_.parallelism.pipeline_parallel_microbatch_size) +
                      ", stages " + std::to_string(stage_modules_.size()) + " per rank)"
                : "")
        << (layout.tp > 1 ? std::string(" (sequence parallel ") +
                                (config_.parallelism.enable_sequence_parallel ? "on" : "off") +
                                ", loss parallel " +
                                (config_.parallelism.disable_loss_parallel ? "off" : "on") + ")"
                          : "")
        << "; " << (dp_mesh_ ? "FSDP over " + dp_mesh_->describe() : std::string("no FSDP"))
        << "; parameters computed in " << tc.mixed_precision_param
        << (float8_enabled(config_) ? " (the float8 layers' GEMMs in FP8)" : "")
        << ", gradients reduced in " << tc.mixed_precision_reduce
        << ", float32 master weights; reshard after forward: "
        << (dp_mesh_ ? reshard_text_ : std::string("n/a")) << "\n";
  }
}

}  // namespace mt::train
