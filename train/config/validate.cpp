#include "train/config/validate.h"

#include <string>

#include "runtime/core/error.h"
#include "train/config/schema.h"
#include "train/config/suggest.h"

namespace mt::train::config {

namespace {

// "training.steps = 100 (configs/x.toml line 3)": a key with its value and origin.
std::string show(const JobConfig& config, std::string_view key) {
  const FieldSpec* f = find_field(key);
  MT_CHECK(f, "validate: no config key '", key, "'");  // a typo in a rule below
  return std::string(key) + " = " + to_toml(f->get(config)) + " (" + config.where(key) + ")";
}

void check_field(const JobConfig& config, const FieldSpec& field) {
  const Value value = field.get(config);
  if (field.check.passes(value)) return;
  const std::string key = field.key();
  std::string hint;
  if (auto* s = std::get_if<std::string>(&value); s && !field.check.choices.empty()) {
    if (auto best = nearest(*s, field.check.choices)) hint = "; did you mean " + quote(*best) + "?";
  }
  MT_FAIL(key, ": must be ", field.check.rule, ", got ", to_toml(value), " at ", config.where(key),
          hint);
}

// A rule about several keys: fails naming each key, its value and its origin.
template <class... Keys>
void require(bool ok, const JobConfig& config, std::string_view rule, const Keys&... keys) {
  if (ok) return;
  std::string shown;
  ((shown += (shown.empty() ? "" : ", ") + show(config, keys)), ...);
  MT_FAIL("invalid config: ", rule, "; got ", shown);
}

// [quantize.grouped_mm.float8]. training.device = "auto" is checked once resolved, by the
// trainer.
void validate_float8_grouped_mm(const JobConfig& config) {
  const Float8GroupedMMConfig& f = config.float8_grouped_mm;
  if (f.fqns.empty()) return;
  require(config.training.device != "cpu" || f.emulate, config,
          "float8 grouped GEMMs on the CPU: the CPU has no FP8 GEMMs (they need a GPU with FP8 "
          "tensor cores); set quantize.grouped_mm.float8.emulate = true to run the exact CPU "
          "reference (for tests and debugging)",
          "quantize.grouped_mm.float8.fqns", "training.device", "quantize.grouped_mm.float8.emulate");
}

// [quantize.linear.float8]. training.device = "auto" is checked once resolved, by the trainer.
void validate_float8(const JobConfig& config) {
  const Float8LinearConfig& f = config.float8;
  require(f.enable || !f.enable_fsdp_float8_all_gather, config,
          "quantize.linear.float8.enable_fsdp_float8_all_gather needs float8 training "
          "(quantize.linear.float8.enable = true)",
          "quantize.linear.float8.enable_fsdp_float8_all_gather", "quantize.linear.float8.enable");
  require(f.recipe_name == "tensorwise" || !f.enable_fsdp_float8_all_gather, config,
          "quantize.linear.float8.enable_fsdp_float8_all_gather gathers tensorwise codes (one "
          "scale per weight); the rowwise recipe scales each weight per output feature, so it "
          "gathers the high-precision weight (set enable_fsdp_float8_all_gather = false, as "
          "torchao does)",
          "quantize.linear.float8.recipe_name", "quantize.linear.float8.enable_fsdp_float8_all_gather");
  require(f.enable_fsdp_float8_all_gather || !f.precompute_float8_dynamic_scale_for_fsdp, config,
          "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp needs "
          "quantize.linear.float8.enable_fsdp_float8_all_gather = true",
          "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
          "quantize.linear.float8.enable_fsdp_float8_all_gather");
  if (!f.enable) return;
  require(config.training.device != "cpu" || f.emulate, config,
          "float8 training on the CPU: the CPU has no FP8 GEMMs (float8 training needs a GPU with "
          "FP8 tensor cores); set quantize.linear.float8.emulate = true to run the exact CPU "
          "reference (for tests and debugging)",
          "quantize.linear.float8.enable", "training.device", "quantize.linear.float8.emulate");
}

// [parallelism] pipeline_parallel_*: what can be checked without the model (the trainer checks
// the stages against the model's layers, and builds the schedule, before any work).
void validate_pipeline(const JobConfig& config, WorldLayout& out) {
  const ParallelismConfig& p = config.parallelism;
  require(config.training.local_batch_size % p.pipeline_parallel_microbatch_size == 0, config,
          "training.local_batch_size must be a multiple of "
          "parallelism.pipeline_parallel_microbatch_size (each local batch is split into "
          "micro-batches that flow through the pipeline)",
          "training.local_batch_size", "parallelism.pipeline_parallel_microbatch_size");
  out.microbatches = out.pp > 1 ? config.training.local_batch_size /
                                      p.pipeline_parallel_microbatch_size
                                : 1;
  if (out.pp == 1) return;
  require(p.pipeline_parallel_layers_per_stage == -1 || p.pipeline_parallel_split_points.empty(),
          config,
          "give either parallelism.pipeline_parallel_layers_per_stage or "
          "parallelism.pipeline_parallel_split_points, not both",
          "parallelism.pipeline_parallel_layers_per_stage",
          "parallelism.pipeline_parallel_split_points");
}

}  // namespace

void validate(const JobConfig& config) {
  for (const SectionSpec& s : schema()) {
    for (const FieldSpec& f : s.fields) check_field(config, f);
  }
  const TrainingConfig& t = config.training;
  require(t.global_batch_size == -1 || t.global_batch_size % t.local_batch_size == 0, config,
          "training.global_batch_size must be a multiple of training.local_batch_size",
          "training.global_batch_size", "training.local_batch_size");
  // A warmup longer than the run is not an error: the schedule clamps it to training.steps
  // (make_lr_scheduler warns), so a quick `--training.steps=4` run of any config works.
  require(!config.checkpoint.enable || config.checkpoint.interval > 0, config,
          "checkpoint.interval must be > 0 when checkpoint.enable = true", "checkpoint.interval",
          "checkpoint.enable");
  // A requeued job starts again from its last checkpoint: without checkpoints, from step 0.
  require(!config.job.requeue_on_preemption || config.checkpoint.enable, config,
          "job.requeue_on_preemption needs checkpoint.enable = true (the requeued job resumes "
          "from the checkpoint saved at the stop)",
          "job.requeue_on_preemption", "checkpoint.enable");
  require(!config.profiling.execution_trace || config.profiling.enable, config,
          "profiling.execution_trace records the profiled steps: set profiling.enable = true",
          "profiling.execution_trace", "profiling.enable");
  require(!config.profiling.enable || config.profiling.profile_freq > 0, config,
          "profiling.profile_freq must be > 0 when profiling.enable = true",
          "profiling.profile_freq", "profiling.enable");
  require(!config.validation.enable || config.validation.freq > 0, config,
          "validation.freq must be > 0 when validation.enable = true", "validation.freq",
          "validation.enable");
  validate_float8(config);
  validate_float8_grouped_mm(config);
}

WorldLayout validate_for_world(const JobConfig& config, int64_t world_size) {
  MT_CHECK(world_size >= 1, "validate_for_world: expected a world size >= 1, got ", world_size);
  validate(config);  // every degree and batch size below is > 0 (or -1) from here on
  const ParallelismConfig& p = config.parallelism;
  const std::string world = "the world size " + std::to_string(world_size);
  WorldLayout out;
  out.tp = p.tensor_parallel_degree;
  out.pp = p.pipeline_parallel_degree;
  out.cp = p.context_parallel_degree;
  out.dp_replicate = p.data_parallel_replicate_degree;
  const int64_t others = out.pp * out.dp_replicate * out.cp * out.tp;
  require(world_size % others == 0, config,
          "pipeline_parallel_degree x data_parallel_replicate_degree x context_parallel_degree x "
          "tensor_parallel_degree must divide " + world,
          "parallelism.pipeline_parallel_degree", "parallelism.data_parallel_replicate_degree",
          "parallelism.context_parallel_degree", "parallelism.tensor_parallel_degree");
  out.dp_shard = p.data_parallel_shard_degree == -1 ? world_size / others
                                                    : p.data_parallel_shard_degree;
  require(others * out.dp_shard == world_size, config,
          "pipeline_parallel_degree x data_parallel_replicate_degree x data_parallel_shard_degree "
          "x context_parallel_degree x tensor_parallel_degree must equal " + world,
          "parallelism.pipeline_parallel_degree", "parallelism.data_parallel_replicate_degree",
          "parallelism.data_parallel_shard_degree", "parallelism.context_parallel_degree",
          "parallelism.tensor_parallel_degree");
  validate_pipeline(config, out);
  require(out.cp == 1 || config.training.seq_len % (2 * out.cp) == 0, config,
          "training.seq_len must be a multiple of 2 x context_parallel_degree (context "
          "parallelism cuts each sequence into 2 x cp equal chunks, two per rank, so that each "
          "rank gets the same share of causal attention)",
          "training.seq_len", "parallelism.context_parallel_degree");
  // Tensor parallelism splits each rank's share of a sequence (all of it without cp) over tp.
  const bool whole = out.cp == 1;
  require(out.tp == 1 || (config.training.seq_len / out.cp) % out.tp == 0, config,
          std::string(whole ? "training.seq_len" : "training.seq_len / context_parallel_degree") +
              " must be a multiple of tensor_parallel_degree (tensor parallelism splits " +
              (whole ? "each sequence" : "each rank's share of a sequence") + " over the tp ranks)",
          "training.seq_len", "parallelism.context_parallel_degree",
          "parallelism.tensor_parallel_degree");
  out.dp = out.dp_replicate * out.dp_shard;
  out.ep = p.expert_parallel_degree;
  // Experts borrow their ranks from dp_shard x cp (torchtitan's layout): cp ranks route
  // different tokens, as dp_shard ranks do.
  require((out.dp_shard * out.cp) % out.ep == 0, config,
          "parallelism.expert_parallel_degree must divide data_parallel_shard_degree x "
          "context_parallel_degree (" +
              std::to_string(out.dp_shard * out.cp) + " on " + world + ")",
          "parallelism.expert_parallel_degree", "parallelism.data_parallel_shard_degree",
          "parallelism.context_parallel_degree");

  const TrainingConfig& t = config.training;
  int64_t per_step = 0;
  require(!__builtin_mul_overflow(t.local_batch_size, out.dp, &per_step), config,
          "training.local_batch_size x data-parallel degree must fit in 64 bits",
          "training.local_batch_size");
  out.global_batch_size = t.global_batch_size == -1 ? per_step : t.global_batch_size;
  require(out.global_batch_size % per_step == 0, config,
          "training.global_batch_size must be a multiple of local_batch_size x data-parallel "
          "degree = " +
              std::to_string(t.local_batch_size) + " x " + std::to_string(out.dp) + " = " +
              std::to_string(per_step) + " on " + world,
          "training.global_batch_size", "training.local_batch_size");
  out.grad_accum_steps = out.global_batch_size / per_step;
  return out;
}

}  // namespace mt::train::config
