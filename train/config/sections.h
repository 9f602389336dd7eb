// One plain struct per TOML section of a job config ([job], [model], [optimizer], ...), holding
// that section's values with their defaults (torchtitan's, where torchtitan has the key).
// Section names may be dotted, as torchtitan's are ([quantize.linear.float8], nested tables in
// TOML); keys never are.
//
// Each component receives only its own section (`const OptimizerConfig&`), never the whole
// JobConfig. What each key means, its valid values and its docs are in ONE place, the schema
// (schema.cpp); `train --help` prints them. Adding a key = a member here + a row in the schema.
// Relative paths in values are relative to the working directory of the run (as in torchtitan);
// only `extends` is relative to the file that contains it.
#pragma once

#include <cstdint>
#include <string>

#include "train/config/value.h"

namespace mt::train::config {

struct JobSectionConfig {  // [job]
  std::string dump_folder = "./outputs";
  std::string description = "default job";
  bool requeue_on_preemption = false;  // SIGUSR1 under SLURM: save, then scontrol requeue
  bool operator==(const JobSectionConfig&) const = default;
};

struct ModelConfig {  // [model]
  std::string name = "llama3";
  std::string flavor = "debugmodel";
  std::string tokenizer_path = "";
  int64_t vocab_size_multiple_of = 1;  // the model's vocab: the tokenizer's, rounded up to it
  double moe_aux_loss_alpha = -1.0;      // MoE models; -1 = the flavor's
  double moe_load_balance_coeff = -1.0;  // MoE models; -1 = the flavor's
  bool operator==(const ModelConfig&) const = default;
};

struct OptimizerConfig {  // [optimizer]
  std::string name = "AdamW";
  double lr = 8e-4;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  bool operator==(const OptimizerConfig&) const = default;
};

struct LRSchedulerConfig {  // [lr_scheduler]
  int64_t warmup_steps = 200;
  double decay_ratio = 1.0;  // 1.0 = torchtitan's None: decay over all steps after warmup
  std::string decay_type = "linear";
  double min_lr_factor = 0.0;
  bool operator==(const LRSchedulerConfig&) const = default;
};

struct TrainingConfig {  // [training]
  int64_t local_batch_size = 8;
  int64_t global_batch_size = -1;  // -1: local_batch_size x data-parallel degree
  int64_t seq_len = 2048;
  int64_t steps = 10000;
  double max_norm = 1.0;
  int64_t seed = 0;
  std::string dataset = "tinyshakespeare";
  std::string dataset_path = "";
  std::string device = "auto";
  std::string mixed_precision_param = "bfloat16";
  std::string mixed_precision_reduce = "float32";
  bool deterministic = false;
  int64_t skip_nonfinite_steps = 0;  // steps with a non-finite gradient norm skipped, not fatal
  bool allow_batch_change = false;   // resume with another global batch than the checkpoint's
  bool operator==(const TrainingConfig&) const = default;
};

struct ParallelismConfig {  // [parallelism]
  int64_t data_parallel_replicate_degree = 1;
  int64_t data_parallel_shard_degree = -1;  // -1: every rank not used by other dimensions
  int64_t expert_parallel_degree = 1;
  int64_t context_parallel_degree = 1;  // ranks that split each sequence (parallel/context)
  std::string context_parallel_rotate_method = "allgather";  // allgather | alltoall (the ring)
  int64_t tensor_parallel_degree = 1;
  bool enable_sequence_parallel = true;  // with tp: norms and residuals on sequence shards
  bool disable_loss_parallel = false;    // with tp: gather the logits before the loss
  std::string fsdp_reshard_after_forward = "default";  // default | always | never
  // Pipeline parallelism (parallel/pipeline): torchtitan's keys.
  int64_t pipeline_parallel_degree = 1;
  std::string pipeline_parallel_schedule = "1F1B";  // GPipe | 1F1B | Interleaved1F1B | ...
  int64_t pipeline_parallel_microbatch_size = 1;  // sequences per micro-batch
  int64_t pipeline_parallel_layers_per_stage = -1;  // -1: from split points, else even stages
  StringList pipeline_parallel_split_points = {};  // e.g. ["layers.4"]: a stage starts there
  int64_t pipeline_parallel_stages_per_rank = -1;  // -1: 2 for interleaved schedules, else 1
  bool operator==(const ParallelismConfig&) const = default;
};

struct CheckpointConfig {  // [checkpoint]
  bool enable = false;
  std::string folder = "checkpoint";
  int64_t interval = 500;
  int64_t keep_latest_k = 10;
  int64_t load_step = -1;
  std::string async_mode = "disabled";
  bool model_only = false;
  std::string export_dtype = "float32";
  std::string initial_load_path = "";
  StringList exclude_from_loading = {};
  bool operator==(const CheckpointConfig&) const = default;
};

struct ActivationCheckpointConfig {  // [activation_checkpoint]
  std::string mode = "selective";
  std::string selective_ac_option = "2";
  bool operator==(const ActivationCheckpointConfig&) const = default;
};

struct Float8LinearConfig {  // [quantize.linear.float8]: float8 training of linear layers
  bool enable = false;
  std::string recipe_name = "tensorwise";
  StringList filter_fqns = {"output"};  // linears whose FQN contains one stay in high precision
  bool emulate = false;                 // allow float8 on the CPU (the exact CPU reference)
  bool enable_fsdp_float8_all_gather = false;  // FSDP gathers the float8 weights as FP8 codes
  bool precompute_float8_dynamic_scale_for_fsdp = false;  // their amaxes: one all-reduce a step
  bool operator==(const Float8LinearConfig&) const = default;
};

// [quantize.grouped_mm.float8]: float8 grouped GEMMs of MoE routed experts (torchtitan's key).
struct Float8GroupedMMConfig {
  StringList fqns = {};  // MoE modules whose FQN contains one of these; empty: off
  bool emulate = false;  // allow it on the CPU (the exact CPU reference)
  bool operator==(const Float8GroupedMMConfig&) const = default;
};

struct MetricsConfig {  // [metrics]
  int64_t log_freq = 10;
  bool save_jsonl = true;
  bool plot = true;
  bool enable_tensorboard = false;  // TensorBoard event files in job.dump_folder/save_tb_folder
  std::string save_tb_folder = "tb";
  bool operator==(const MetricsConfig&) const = default;
};

struct ProfilingConfig {  // [profiling]
  bool enable = false;
  std::string save_traces_folder = "profile_traces";
  int64_t profile_freq = 10;
  bool execution_trace = false;  // each profiled step's kernels and collectives, every rank
  bool operator==(const ProfilingConfig&) const = default;
};

struct ValidationConfig {  // [validation]
  bool enable = false;
  int64_t freq = 10;
  int64_t steps = -1;  // -1: the whole validation split
  bool operator==(const ValidationConfig&) const = default;
};

struct EmbeddingTablesConfig {  // [embedding]: embedding tables of recommendation models (dlrm)
  std::string optimizer = "rowwise_adagrad";
  double lr = 0.05;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  std::string gradient_mode = "fused";
  std::string sharding = "auto";
  int64_t memory_budget_mb = 1024;
  StringList managed_collision = {};
  std::string eviction = "lru";
  StringList lookup_only = {};
  // Kv-backed tables (runtime/sparse/kv/kv_table.h) and update modes.
  std::string storage = "memory";
  StringList storage_override = {};  // "<feature>:memory|kv", per table
  StringList update_override = {};   // "<feature>:train|frozen", per table
  StringList raw_ids = {};           // features whose kv tables key rows by raw 64-bit ids
  std::string kv_path = "";          // "": <dump_folder>/kv
  int64_t cache_rows = 0;            // per table shard; 0: cache_fraction of its rows
  double cache_fraction = 0.1;
  std::string cache_policy = "lru";
  bool prefetch = false;
  // Streaming of updated rows to a serving replica (parallel/embedding/row_stream.h).
  std::string stream_to = "";
  int64_t stream_queue_mb = 64;
  bool stream_state = false;
  bool operator==(const EmbeddingTablesConfig&) const = default;
};

struct CommConfig {  // [comm]
  int64_t timeout_seconds = 300;
  bool trace = false;  // every collective to <dump_folder>/comm/rank-N.jsonl
  bool operator==(const CommConfig&) const = default;
};

}  // namespace mt::train::config
