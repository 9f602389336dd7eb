// Trainer: the training loop of the `train` binary, as a class that tests can drive too.
//
//   JobConfig config = config::load_config("configs/debug_model.toml", {"--training.steps=50"});
//   Trainer trainer(config);          // tokenizer, token file, model, optimizer, schedule, loader
//   TrainResult result = trainer.train();
//
// What the constructor sets up, from the config sections:
//   tokenizer   model.tokenizer_path (a tokenizer.json or its folder); its vocab size becomes the
//               model's vocab_size.
//   data        training.dataset_path: a token file made by mt_prepare_dataset (HDF5). A plain
//               text file (*.txt) is tokenized once into <dump_folder>/<name>.tokens.h5 (documents
//               split at blank lines, as mt_prepare_dataset does by default) and reused while the
//               tokenizer and the text are unchanged. A missing file is an error that says how to
//               make one (train/token_data.h). With validation.enable, the last kValFraction of
//               the windows are held out.
//   model       models::get_model_spec(model.name, model.flavor), vocab from the tokenizer,
//               max_seq_len = training.seq_len, initialised from training.seed (float32).
//   optimizer   [optimizer] (AdamW or SGD) and the warmup-stable-decay [lr_scheduler].
//   ranks       every rank of the launch (mpirun, srun, or one process alone) is a data-parallel
//               rank: the [parallelism] degrees make a (dp_replicate, dp_shard) DeviceMesh, and on
//               more than one rank the model is FSDP-sharded over it (models' parallelize hook;
//               training.mixed_precision_* is FSDP's policy, so one rank trains in float32).
//               Each rank reads its own part of the global batch (data::Loader rank/world).
//               Tensor, context and pipeline parallelism group ranks that share batches
//               (docs/tensor_parallel.md, docs/context_parallel.md, docs/pipeline.md).
// One optimizer step = grad_accum micro-batches (global_batch_size / (local_batch_size x dp));
// the loss is the SUM of token cross-entropies of all micro-batches on all ranks divided by their
// global count of valid tokens (so accumulation and N ranks give the same gradient as one large
// batch; FSDP then sums, not averages, over ranks), gradients are clipped to training.max_norm
// (the total norm over every shard, before clipping, is logged), then the optimizer and the
// scheduler step. Only rank 0 logs and writes files; a stop signal on any rank stops all of them
// at the end of the same step.
// Logging: a line every metrics.log_freq steps (train/metrics/step_metrics.h), a validation line
// every validation.freq steps (validation.steps batches, -1 = all), metrics.jsonl and loss.svg in
// job.dump_folder, the resolved config in <dump_folder>/config.toml; at the start, the launcher
// and one line per node (train/launch_layout.h). SIGINT/SIGTERM/SIGUSR1 stop at the end of the
// running step (train/signals.h; SIGUSR1 may requeue a SLURM job, train/job_requeue.h). At the
// end, a short text sample from the model.
// Reproducibility: training.seed keys the weights and the data order; every runtime CPU kernel
// has a fixed reduction order, so two runs of one config give bit-for-bit identical losses for
// any thread count.
#pragma once

#include <any>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/ops/loss.h"  // runtime::Tensor, runtime::Reduction
#include "train/config/job_config.h"
#include "train/train_result.h"

namespace mt::data {
class BpeTokenizer;
class Loader;
struct Batch;
}  // namespace mt::data
namespace mt::models {
struct ModelSpec;
struct BuildOptions;
namespace llama {
struct GenerateOptions;
struct GenerateResult;
}  // namespace llama
}  // namespace mt::models
namespace mt::runtime::nn {
class Module;
}
namespace mt::runtime::optim {
class Optimizer;
class LRScheduler;
}  // namespace mt::runtime::optim
namespace mt::parallel {
class ProcessGroup;
class DeviceMesh;
class ContextParallel;
namespace pipeline {
class PipelineRunner;
}
}  // namespace mt::parallel

namespace mt::train {

class TrainCheckpointer;
struct PipelinePlan;

// Share of the token windows held out for validation when validation.enable is set.
inline constexpr double kValFraction = 0.05;

struct TrainerOptions {
  // Called with the flavor's args (llama::ModelArgs for llama3) after vocab_size is set, before
  // they are checked against a checkpoint's saved architecture and built: tests shrink the model
  // with it. Not called for model.flavor = "from_checkpoint" (train/model_spec.h).
  std::function<void(std::any& model_args)> edit_model_args = nullptr;
  std::ostream* log = nullptr;     // progress lines; nullptr: std::cout
  bool quiet = false;              // no progress lines at all
  bool handle_signals = true;      // install the SIGINT/SIGTERM StopRequest during train()
  bool write_files = true;         // config.toml, metrics.jsonl, loss.svg in dump_folder
  std::string sample_prompt = "";  // text the final sample starts from ("" = a new document)
  int64_t sample_tokens = 80;      // 0: no sample
  // The ranks of the job; nullptr: every rank of the launch (MpiProcessGroup::world(), one
  // process without a launcher). Tests pass a one-rank group for single-process references.
  std::shared_ptr<parallel::ProcessGroup> world = nullptr;
};


// One line: parameter count and training FLOPs per token of the job's model, computed from its
// args alone (nothing allocated, so 405B works). `train --describe-model` prints it.
std::string describe_model(const config::JobConfig& job);

class Trainer {
 public:
  // Sets everything up (see the header comment); errors are mt::Error for the user.
  explicit Trainer(config::JobConfig config, TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs training.steps optimizer steps (or until a stop signal).
  TrainResult train();

  // Mean token cross-entropy over `max_batches` validation batches (-1: all); nullopt when there
  // is no validation split.
  std::optional<double> validation_loss(int64_t max_batches) const;

  // Samples up to max_new_tokens after `prompt` ("" = start a new document), temperature 0.8 and
  // top-k 40 drawn from training.seed (greedy with temperature 0).
  // llama3 and deepseek_v3, under every parallelism; with a pipeline the tokens go through the
  // stages (PipelineRunner::forward_through_stages), and the last stage's rank chooses each.
  // train/trainer_sample.cpp.
  std::string generate_sample(const std::string& prompt, int64_t max_new_tokens,
                              double temperature = 0.8) const;

  const config::JobConfig& config() const { return config_; }
  int64_t num_params() const;
  int64_t grad_accum_steps() const { return grad_accum_; }
  int64_t rank() const;
  int64_t world_size() const;
  const std::filesystem::path& token_file() const { return token_file_; }

 private:
  std::ostream& log() const;
  bool shards_parameters() const;  // FSDP (and mixed precision) wrap the model
  // training.mixed_precision_param: the dtype FSDP's forward computes in and stages exchange.
  runtime::DType param_compute_dtype() const;
  // "selective, every 2 blocks (8 blocks recomputed in backward)": what the log says.
  std::string activation_checkpointing_text() const;
  // The run's first log lines (job, model, data, steps, device, parallelism; trainer_header.cpp).
  void log_run_header(std::ostream& out, int64_t tokens_per_step, double flops_per_token,
                      const std::optional<double>& peak) const;
  // Whether FSDP computes in bf16 (mixed precision), and the device's peak FLOP/s in that dtype
  // that MFU is measured against (nullopt: unknown device).
  bool computes_in_bf16() const;
  std::optional<double> mfu_peak_flops() const;
  void setup_parallelism();         // FSDP over the data-parallel (and expert) meshes
  // pp > 1: builds this rank's stages (each alone, without values when sharded), parallelizes
  // them as setup_parallelism does, and the runner of the schedule (train/pipeline_setup.h).
  void build_pipeline(const PipelinePlan& plan, const models::BuildOptions& build);
  // One batch through the pipeline: the micro-batches' summed token losses (zero on ranks
  // without the last stage), their gradients / valid accumulated in the stages' parameters.
  runtime::Tensor pipeline_batch_loss(const runtime::Tensor& inputs, const runtime::Tensor& labels,
                                      double valid);
  // Adds a micro-batch's summed loss term (detached) to pipeline_loss_sum_, the rank's logged
  // sum, and returns the term to differentiate: term / the step's valid tokens.
  runtime::Tensor add_to_pipeline_loss(const runtime::Tensor& term);
  // The same without gradients (validation): the summed token losses, zero without the last
  // stage.
  runtime::Tensor pipeline_eval_loss(const runtime::Tensor& inputs,
                                     const runtime::Tensor& labels) const;
  // Whether the model decodes text (its spec's forward_cached: llama3, deepseek_v3).
  bool can_sample() const;
  // generate_sample's decoding: on the model, or through the pipeline's stages, with a KV cache
  // of each module's layers.
  models::llama::GenerateResult decode(const std::vector<int64_t>& prompt,
                                       const models::llama::GenerateOptions& options) const;
  // One step's loss and gradient norm where the step left them (trainer.cpp).
  struct StepValues;
  // The model's after_optimizer_step hook (MoE load balancing) on its layers, pipeline stages
  // included; the metrics it returns (for the log).
  std::map<std::string, double> after_optimizer_step();
  // One optimizer step. Its values stay where they are: on a GPU the host reads them only at a
  // logged step (read_steps), so it queues the next steps instead of waiting for each to end.
  StepValues train_step();
  // Reads the steps' values on the host, in order, into result (losses, norms, model metrics),
  // and clears `unread` (whose last step is `last_step`): a wait for the device when they are on
  // one. A non-finite loss or norm of a step that was not skipped stops the run (fail_nonfinite).
  void read_steps(std::vector<StepValues>& unread, int64_t last_step, TrainResult& result) const;
  // Throws the mt::Error that stops a run at a non-finite step, naming the last checkpoint.
  [[noreturn]] void fail_nonfinite(int64_t step, double loss, double grad_norm) const;
  // Runs fn on rank 0, then (when it succeeded) on the other ranks; rank 0's error stops all.
  template <class Fn>
  auto on_rank0_first(const char* what, Fn&& fn) -> decltype(fn());
  // Sum of `value` over every rank (the value itself on one rank).
  double sum_over_ranks(double value, const char* name) const;
  // Sum over the data-parallel ranks: the ranks of one tensor-parallel group hold the same
  // batches and losses, which count once (the ranks of a cp group hold different tokens: each
  // counts).
  double sum_over_dp(double value, const char* name) const;
  // Context parallelism (cp > 1): this rank's share of each sequence of a batch (inputs and
  // labels); the batch itself otherwise.
  data::Batch shard_sequences(data::Batch batch) const;
  // While one lives, the model (each pipeline stage) computes on this rank's sequence shards
  // (cp > 1; nothing otherwise): the training step's forward and backward, and validation.
  // Decoding (the text sample) runs outside, on whole sequences.
  class SequenceShardScope {
   public:
    explicit SequenceShardScope(const Trainer& trainer);
    ~SequenceShardScope();
    SequenceShardScope(const SequenceShardScope&) = delete;
    SequenceShardScope& operator=(const SequenceShardScope&) = delete;

   private:
    const Trainer& trainer_;
  };
  // The modules the model runs as: the pipeline's stages on this rank, or the model.
  std::vector<runtime::nn::Module*> model_parts() const;
  // The ranks that share one batch (tp x cp x pp): tokens/s per rank divide by it.
  int64_t ranks_per_batch() const { return tp_ * cp_ * pp_; }
  // Sum of the step losses: over the data-parallel ranks, and over the pipeline stages (only the
  // last stage's ranks hold losses; the others add zero).
  double sum_losses(double value, const char* name) const;
  // The summed (or per-token) cross-entropy of the model on a batch: the model spec's loss, or
  // with tensor parallelism a loss-parallel one over the vocab-split logits.
  runtime::Tensor batch_loss(const runtime::Tensor& inputs, const runtime::Tensor& labels,
                             runtime::Reduction reduction) const;
  // The token cross-entropy of the model's logits (loss parallel under tp: this rank's vocab
  // columns).
  runtime::Tensor logits_loss(const runtime::Tensor& logits, const runtime::Tensor& labels,
                              runtime::Reduction reduction) const;

  config::JobConfig config_;
  TrainerOptions options_;
  // Every rank of the job, over MPI (host-side values: logged losses, errors, checkpoints).
  std::shared_ptr<parallel::ProcessGroup> world_;
  runtime::Device device_;  // where the model trains ([training] device, resolved)
  // The same ranks over the training device's backend (NCCL on CUDA, else world_): the meshes
  // FSDP communicates on are split from it.
  std::shared_ptr<parallel::ProcessGroup> device_world_;
  // Null on one rank in float32 (nothing to shard); one rank with a 16-bit mixed_precision_param
  // gets a 1-rank mesh, so FSDP's mixed precision (16-bit compute, f32 master weights) applies.
  std::shared_ptr<parallel::DeviceMesh> dp_mesh_;
  // (dp_replicate, ep, efsdp) when parallelism.expert_parallel_degree > 1, else null.
  std::shared_ptr<parallel::DeviceMesh> expert_mesh_;
  // With parallelism.tensor_parallel_degree > 1: the mesh (dp_replicate, dp_shard, tp), its tp
  // sub-mesh (null otherwise; dp_shard is dp_shard_cp, dp_shard x cp, under context
  // parallelism), and on the host the ranks whose losses and token counts add up (world_ without
  // tp and pp: dp and cp).
  std::shared_ptr<parallel::DeviceMesh> world_mesh_, tp_mesh_;
  std::shared_ptr<parallel::ProcessGroup> dp_world_;
  int64_t tp_ = 1;
  // Context parallelism (parallelism.context_parallel_degree > 1): the cp ranks' attention and
  // sequence split, and this rank's positions of a training sequence (null / undefined: off).
  int64_t cp_ = 1;
  std::unique_ptr<parallel::ContextParallel> context_parallel_;
  runtime::Tensor sequence_positions_;
  // Pipeline parallelism (pp > 1): the pp ranks of this rank's pipeline (over the device's
  // backend), this rank's stage modules (model_ is their merged view, for the optimizer and
  // checkpoints), the schedule's runner, and the current batch's labels per micro-batch.
  int64_t pp_ = 1;
  std::shared_ptr<parallel::ProcessGroup> pp_group_;
  // On the host: the ranks of one tp coordinate (the losses' sum), of one stage, and this rank's
  // pp ranks (pp > 1).
  std::shared_ptr<parallel::ProcessGroup> loss_world_, stage_world_, host_pp_group_;
  std::vector<std::shared_ptr<runtime::nn::Module>> stage_modules_;
  std::unique_ptr<parallel::pipeline::PipelineRunner> pipeline_;
  std::vector<runtime::Tensor> pipeline_labels_;
  double pipeline_valid_ = 1.0;
  runtime::Tensor pipeline_loss_sum_;
  std::string reshard_text_;  // fsdp_reshard_after_forward as applied, for the log
  std::string float8_text_;   // what [quantize.linear.float8] converted, for the log; "" when off
  std::unique_ptr<data::BpeTokenizer> tokenizer_;
  std::filesystem::path token_file_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<models::ModelSpec> spec_;
  std::shared_ptr<runtime::nn::Module> model_;
  std::unique_ptr<runtime::optim::Optimizer> optimizer_;
  std::unique_ptr<runtime::optim::LRScheduler> scheduler_;
  std::unique_ptr<TrainCheckpointer>
      checkpointer_;  // null without [checkpoint] enable / initial load
  int64_t grad_accum_ = 1;
  int64_t global_batch_size_ = 0;  // sequences per optimizer step, all ranks
  std::string placement_text_;     // the launcher and one line per node, for the log
  mutable std::ostream null_log_{nullptr};  // discards (TrainerOptions::quiet)
};

}  // namespace mt::train
