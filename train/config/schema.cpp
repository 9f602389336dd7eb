// The tables of every section and key. To add a key: a member in sections.h and a row here.
#include "train/config/schema.h"

#include <charconv>
#include <cmath>
#include <variant>

namespace mt::train::config {

namespace {

// A row of a section's table, typed by the section struct S: the member pointer fixes the type.
template <class S>
struct Field {
  template <class T>
  Field(std::string_view name, T S::*member, std::string_view doc, Check check = Check())
      : name(name), member(member), doc(doc), check(std::move(check)) {}

  std::string_view name;
  std::variant<bool S::*, int64_t S::*, double S::*, std::string S::*, StringList S::*> member;
  std::string_view doc;
  Check check;
};

template <class M>
struct MemberType;
template <class S, class T>
struct MemberType<T S::*> {
  using type = T;
};

// Turns a typed table into the type-erased SectionSpec every consumer iterates.
template <class S>
SectionSpec section(std::string_view name, S JobConfig::*sec, std::string_view doc,
                    std::vector<Field<S>> fields) {
  SectionSpec out{name, doc, {}};
  for (const Field<S>& f : fields) {
    FieldSpec spec{name, f.name, FieldType::Bool, f.doc, f.check, nullptr, nullptr};
    std::visit(
        [&](auto member) {
          using T = typename MemberType<decltype(member)>::type;
          spec.type = field_type_of<T>();
          spec.get = [sec, member](const JobConfig& c) -> Value { return (c.*sec).*member; };
          spec.set = [sec, member](JobConfig& c, const Value& v) {
            (c.*sec).*member = std::get<T>(v);
          };
        },
        f.member);
    out.fields.push_back(std::move(spec));
  }
  return out;
}

const std::vector<std::string> kFloatDtypes = {"float32", "bfloat16", "float16"};

// activation_checkpoint.selective_ac_option: a positive block period as a string, or "op"
// (op-level), torchtitan's forms.
bool block_period_or_op(const Value& v) {
  const auto* s = std::get_if<std::string>(&v);
  if (!s) return false;
  if (*s == "op") return true;
  int64_t n = 0;
  auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), n);
  return ec == std::errc() && end == s->data() + s->size() && n > 0;
}

// quantize.linear.float8.recipe_name: torchtitan's recipes (torchao's names).
Check float8_recipe() { return one_of({"tensorwise", "rowwise"}); }

// model.moe_*: -1 (keep the flavor's value) or a weight >= 0.
Check flavor_or_non_negative() {
  return custom(">= 0, or -1 for the flavor's value", [](const Value& v) {
    double x = 0;
    if (const auto* d = std::get_if<double>(&v)) x = *d;
    else if (const auto* i = std::get_if<int64_t>(&v)) x = double(*i);
    else return false;
    return std::isfinite(x) && (x >= 0 || x == -1.0);
  });
}

std::vector<SectionSpec> build_schema() {
  using J = JobSectionConfig;
  using M = ModelConfig;
  using O = OptimizerConfig;
  using L = LRSchedulerConfig;
  using T = TrainingConfig;
  using P = ParallelismConfig;
  using C = CheckpointConfig;
  using A = ActivationCheckpointConfig;
  using Q = Float8LinearConfig;
  using QG = Float8GroupedMMConfig;
  using X = MetricsConfig;
  using F = ProfilingConfig;
  using V = ValidationConfig;
  using N = CommConfig;
  using E = EmbeddingTablesConfig;
  std::vector<SectionSpec> s;
  s.push_back(section<J>(
      "job", &JobConfig::job, "The run as a whole.",
      {
          {"dump_folder", &J::dump_folder,
           "Folder for everything a run writes: logs, metrics, plots, checkpoints, config.toml",
           non_empty()},
          {"description", &J::description, "Free text describing the run, shown in its logs"},
          {"requeue_on_preemption", &J::requeue_on_preemption,
           "Under SLURM, SIGUSR1 (sbatch --signal=USR1@SECONDS, a preemption or time-limit "
           "warning) stops the run at the end of the step, saves a checkpoint and requeues the "
           "job (scontrol requeue), which resumes from it; SIGTERM and SIGINT never requeue"},
      }));
  s.push_back(section<M>(
      "model", &JobConfig::model, "Which model to build.",
      {
          {"name", &M::name, "Model family in the model registry (e.g. \"llama3\")", non_empty()},
          {"flavor", &M::flavor, "Size of the model family (e.g. \"debugmodel\", \"8B\")",
           non_empty()},
          {"tokenizer_path", &M::tokenizer_path,
           "Hugging Face tokenizer.json (or the folder that holds it)"},
          {"vocab_size_multiple_of", &M::vocab_size_multiple_of,
           "Pad the model's vocab (embedding rows, output features) from the tokenizer's up to "
           "a multiple of this, e.g. 64: GPT-2's 50257 -> 50304, GEMM-friendly and FP8-able "
           "(multiples of 16); padded ids are never inputs, targets or sampled; 1 = no padding",
           positive()},
          {"moe_aux_loss_alpha", &M::moe_aux_loss_alpha,
           "MoE models (deepseek_v3): weight of DeepSeek-V3's sequence-wise balance loss, "
           "alpha * sum_i f_i P_i per sequence, added to the loss; 0 = off; -1 = the flavor's "
           "(0 in every shipped flavor)",
           flavor_or_non_negative()},
          {"moe_load_balance_coeff", &M::moe_load_balance_coeff,
           "MoE models (deepseek_v3): step of the auxiliary-loss-free routing bias update after "
           "each optimizer step, expert_bias += coeff * sign(mean load - load); 0 = off; -1 = "
           "the flavor's (1e-3 in every shipped flavor)",
           flavor_or_non_negative()},
      }));
  s.push_back(section<O>(
      "optimizer", &JobConfig::optimizer, "The optimizer.",
      {
          {"name", &O::name, "AdamW (decoupled weight decay) or SGD (uses lr and weight_decay)",
           one_of({"AdamW", "SGD"})},
          {"lr", &O::lr, "Peak learning rate (the schedule scales it)", positive()},
          {"eps", &O::eps, "AdamW epsilon, added to the denominator", non_negative()},
          {"weight_decay", &O::weight_decay, "Weight decay coefficient", non_negative()},
          {"beta1", &O::beta1, "AdamW first-moment decay", in_half_open(0, 1)},
          {"beta2", &O::beta2, "AdamW second-moment decay", in_half_open(0, 1)},
      }));
  s.push_back(section<L>(
      "lr_scheduler", &JobConfig::lr_scheduler,
      "Warmup-stable-decay schedule of the learning rate (factor of optimizer.lr).",
      {
          {"warmup_steps", &L::warmup_steps,
           "Steps of linear warmup (clamped to training.steps, with a warning)", non_negative()},
          {"decay_ratio", &L::decay_ratio,
           "Share of all steps spent decaying, at the end; 1.0 = decay right after warmup",
           in_range(0, 1)},
          {"decay_type", &L::decay_type, "Shape of the decay",
           one_of({"linear", "sqrt", "cosine"})},
          {"min_lr_factor", &L::min_lr_factor,
           "Learning rate the decay ends at (one step after the run), as a factor of lr",
           in_range(0, 1)},
      }));
  s.push_back(section<T>(
      "training", &JobConfig::training, "The training loop and its data.",
      {
          {"local_batch_size", &T::local_batch_size, "Sequences per rank per micro-step",
           positive()},
          {"global_batch_size", &T::global_batch_size,
           "Sequences per optimizer step, all ranks and micro-steps; -1 = local x dp degree",
           positive_or(-1)},
          {"seq_len", &T::seq_len, "Tokens per sequence", positive()},
          {"steps", &T::steps, "Optimizer steps to train", positive()},
          {"max_norm", &T::max_norm, "Clip gradients to this global L2 norm", positive()},
          {"seed", &T::seed, "Seed of weights, data order and dropout (same for any world size)",
           non_negative()},
          {"dataset", &T::dataset, "Name of the dataset (for logs and the data pipeline)",
           non_empty()},
          {"dataset_path", &T::dataset_path,
           "Text file (tokenized into the dump folder) or tokenized HDF5 file (mt_prepare_dataset, "
           "also from JSON lines) of the dataset (language models; required), "
           "or the ml-100k folder (dataset = \"movielens\"); synthetic datasets take none"},
          {"device", &T::device, "Where to train; auto = the GPU when there is one, else the CPU",
           one_of({"auto", "cpu", "cuda"})},
          {"mixed_precision_param", &T::mixed_precision_param,
           "Dtype of parameters in forward/backward (master weights stay float32)",
           one_of(kFloatDtypes)},
          {"mixed_precision_reduce", &T::mixed_precision_reduce,
           "Dtype of gradient reductions across ranks", one_of({"float32", "bfloat16"})},
          {"skip_nonfinite_steps", &T::skip_nonfinite_steps,
           "Steps whose loss or gradient norm is NaN or infinite that may be skipped (no "
           "optimizer update, a warning) before the run stops; 0 = stop at the first. With "
           "more than 0 the norm is read every step (a host sync on GPUs)",
           non_negative()},
          {"allow_batch_change", &T::allow_batch_change,
           "Resume a checkpoint with another global batch than it was trained with (e.g. on a "
           "rank count that changes global_batch_size = -1); else that is an error"},
          {"deterministic", &T::deterministic,
           "Use only deterministic kernels: bit-for-bit reproducible runs on a GPU too, with "
           "cuDNN's slower attention backward (CPU kernels are deterministic either way)"},
      }));
  s.push_back(section<P>(
      "parallelism", &JobConfig::parallelism, "How ranks split the work.",
      {
          {"data_parallel_replicate_degree", &P::data_parallel_replicate_degree,
           "Replicas of the model (DDP / HSDP replicate dimension)", positive()},
          {"data_parallel_shard_degree", &P::data_parallel_shard_degree,
           "Ranks that shard parameters (FSDP); -1 = every rank not used by the other degrees",
           positive_or(-1)},
          {"expert_parallel_degree", &P::expert_parallel_degree,
           "Ranks that split the routed experts of MoE layers (taken from the shard ranks)",
           positive()},
          {"context_parallel_degree", &P::context_parallel_degree,
           "Ranks that split each sequence (context parallelism, between dp_shard and tp on the "
           "mesh): each holds 1/cp of every sequence's tokens and activations, attention "
           "all-gathers the keys and values; they read the same batches and FSDP shards over "
           "them too. training.seq_len must be a multiple of 2 x cp",
           positive()},
          {"context_parallel_rotate_method", &P::context_parallel_rotate_method,
           "How each rank's attention sees the other cp ranks' keys and values (torchtitan's "
           "names): allgather = each layer all-gathers them (the whole sequence's kept for "
           "backward); alltoall = they pass around a ring of the cp ranks, overlapped with "
           "compute, and nothing of another rank's is kept (CPU only for now)",
           one_of({"allgather", "alltoall"})},
          {"tensor_parallel_degree", &P::tensor_parallel_degree,
           "Ranks that split each layer's matrices (tensor parallelism, the innermost mesh dim: "
           "keep it within a node); they read the same batches",
           positive()},
          {"enable_sequence_parallel", &P::enable_sequence_parallel,
           "With tensor parallelism: norms and the residual stream run on sequence shards "
           "(all-gathers and reduce-scatters instead of all-reduces; less activation memory)"},
          {"disable_loss_parallel", &P::disable_loss_parallel,
           "With tensor parallelism: gather the [tokens, vocab] logits before the loss instead "
           "of a cross-entropy over the vocab-split logits"},
          {"fsdp_reshard_after_forward", &P::fsdp_reshard_after_forward,
           "Free gathered parameters after each block's forward (all-gather again for backward): "
           "default = yes for the blocks when they are sharded over several ranks (on one, no: "
           "nothing to gather), no for the root; always; never (more memory, less communication)",
           one_of({"default", "always", "never"})},
          {"pipeline_parallel_degree", &P::pipeline_parallel_degree,
           "Pipeline stages' ranks (pp, the outermost mesh dim): the layers are split into "
           "stages on different ranks and micro-batches flow through them",
           positive()},
          {"pipeline_parallel_schedule", &P::pipeline_parallel_schedule,
           "The order each rank runs its micro-batches' forwards and backwards in "
           "(train --print-pipeline-schedule draws it)",
           one_of({"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"})},
          {"pipeline_parallel_microbatch_size", &P::pipeline_parallel_microbatch_size,
           "Sequences per pipeline micro-batch; training.local_batch_size must be a multiple",
           positive()},
          {"pipeline_parallel_layers_per_stage", &P::pipeline_parallel_layers_per_stage,
           "Transformer blocks per stage (the first stage also holds the embeddings, the last "
           "the final norm and output); -1 = split evenly into pp x stages_per_rank stages, or at "
           "the split points",
           positive_or(-1)},
          {"pipeline_parallel_split_points", &P::pipeline_parallel_split_points,
           "Explicit stage boundaries, e.g. [\"layers.4\", \"layers.8\"]: each names the first "
           "block of a new stage (pp x stages_per_rank - 1 of them)"},
          {"pipeline_parallel_stages_per_rank", &P::pipeline_parallel_stages_per_rank,
           "Virtual stages per rank for the interleaved schedules (placed round-robin: stage s "
           "on pp rank s % pp); -1 = 2 for the interleaved schedules, 1 for the others",
           positive_or(-1)},
      }));
  s.push_back(section<C>(
      "checkpoint", &JobConfig::checkpoint, "Saving and loading distributed checkpoints.",
      {
          {"enable", &C::enable, "Save checkpoints, and resume from the latest one found"},
          {"folder", &C::folder, "Checkpoint folder, inside job.dump_folder", non_empty()},
          {"interval", &C::interval, "Save every this many steps (> 0 when enabled)"},
          {"keep_latest_k", &C::keep_latest_k, "Keep the newest k checkpoints; 0 = keep all",
           non_negative()},
          {"load_step", &C::load_step, "Step to resume from; -1 = the latest", at_least(-1)},
          {"async_mode", &C::async_mode, "Save in the background while training goes on",
           one_of({"disabled", "async", "async_with_pinned_mem"})},
          {"model_only", &C::model_only,
           "Save only model weights (no optimizer, scheduler or data state)"},
          {"export_dtype", &C::export_dtype, "Dtype of weights saved with model_only",
           one_of(kFloatDtypes)},
          {"initial_load_path", &C::initial_load_path,
           "Checkpoint to start from when the folder has none (e.g. pretrained weights)"},
          {"exclude_from_loading", &C::exclude_from_loading,
           "State parts not to load, e.g. [\"optimizer\", \"lr_scheduler\", \"dataloader\"]"},
      }));
  s.push_back(
      section<A>("activation_checkpoint", &JobConfig::activation_checkpoint,
                 "Recomputing activations in backward to save memory.",
                 {
                     {"mode", &A::mode, "none, full (every block) or selective",
                      one_of({"none", "full", "selective"})},
                     {"selective_ac_option", &A::selective_ac_option,
                      "With selective: N, every N-th block; or \"op\", every block keeping its "
                      "attention and every other matmul output",
                      custom("a positive integer as a string, or \"op\"", block_period_or_op)},
                 }));
  s.push_back(section<Q>(
      "quantize.linear.float8", &JobConfig::float8,
      "Float8 training of linear layers (torchao's convert_to_float8_training): their forward "
      "and both backward GEMMs in FP8 with dynamic scales; weights and gradients stay in their "
      "dtypes.",
      {
          {"enable", &Q::enable,
           "Run the GEMMs of every nn::Linear in FP8 (see recipe_name), "
           "except those filtered and those whose sizes are not multiples of 16; needs a GPU with "
           "FP8 tensor cores (compute capability 8.9+: H100, H200, L40S, RTX 4090)"},
          {"recipe_name", &Q::recipe_name,
           "How values are scaled into FP8: tensorwise = one dynamic scale per tensor (its amax; "
           "e4m3 inputs and weights, e5m2 gradients); rowwise = one scale per row along each "
           "GEMM's contracted dimension, rounded down to a power of two, e4m3 everywhere "
           "(torchao's recipes)",
           float8_recipe()},
          {"filter_fqns", &Q::filter_fqns,
           "Linears whose fully qualified name contains one of these stay in high precision "
           "(the output projection by default: its error reaches the logits directly)"},
          {"emulate", &Q::emulate,
           "Allow float8 on the CPU, which runs the exact CPU reference (emulated FP8 codes, "
           "f32 GEMMs on their values): for tests and debugging, slower than plain float32. "
           "No effect on a GPU, which runs its FP8 GEMMs either way"},
          {"enable_fsdp_float8_all_gather", &Q::enable_fsdp_float8_all_gather,
           "FSDP all-gathers the float8 linears' weights as FP8 codes (half bf16's bytes) with "
           "the whole weight's scale (one all-reduce of the shards' amaxes per group and "
           "gather): the same codes, so the same training, as gathering them in bf16"},
          {"precompute_float8_dynamic_scale_for_fsdp",
           &Q::precompute_float8_dynamic_scale_for_fsdp,
           "With the float8 all-gather: every float8 weight's amax in one all-reduce at the start "
           "of each step, instead of one per FSDP group at each all-gather (same values)"},
      }));
  s.push_back(section<QG>(
      "quantize.grouped_mm.float8", &JobConfig::float8_grouped_mm,
      "Float8 grouped GEMMs of MoE routed experts (torchao's float8 rowwise MoE training): the "
      "experts' forward and both backward grouped GEMMs in FP8, every operand e4m3 with "
      "power-of-two scales per row along each GEMM's contracted dimension (the weight "
      "gradient's over each expert's own tokens); weights and gradients stay in their dtypes.",
      {
          {"fqns", &QG::fqns,
           "MoE modules whose fully qualified name contains one of these run their routed "
           "experts' grouped GEMMs in FP8, e.g. [\"experts\"] (all of them); empty: none. The "
           "experts' dim and hidden dim must be multiples of 16; needs a GPU with FP8 tensor "
           "cores (compute capability 8.9+)"},
          {"emulate", &QG::emulate,
           "Allow it on the CPU, which runs the exact CPU reference (emulated FP8 codes, f32 "
           "GEMMs on their values): for tests and debugging. No effect on a GPU"},
      }));
  s.push_back(section<X>(
      "metrics", &JobConfig::metrics, "Logging of training metrics.",
      {
          {"log_freq", &X::log_freq, "Log a line of metrics every this many steps", positive()},
          {"save_jsonl", &X::save_jsonl, "Also write metrics.jsonl into job.dump_folder"},
          {"plot", &X::plot, "At the end, plot loss against step into job.dump_folder"},
          {"enable_tensorboard", &X::enable_tensorboard,
           "Also write TensorBoard scalars (the logged metrics) into save_tb_folder"},
          {"save_tb_folder", &X::save_tb_folder,
           "TensorBoard event folder, inside job.dump_folder (tensorboard --logdir it)",
           non_empty()},
      }));
  s.push_back(section<F>(
      "profiling", &JobConfig::profiling,
      "Op profiler: a step's kernels, summed by op in the log and written as a Chrome trace.",
      {
          {"enable", &F::enable, "Profile every profile_freq-th step (it runs slower)"},
          {"save_traces_folder", &F::save_traces_folder, "Trace folder, inside job.dump_folder",
           non_empty()},
          {"profile_freq", &F::profile_freq, "Trace one step every this many (> 0 when enabled)"},
          {"execution_trace", &F::execution_trace,
           "Also write each profiled step's execution trace (every kernel and collective in "
           "issue order, with its tensors) on every rank, to <dump_folder>/<save_traces_folder>/"
           "execution_trace/step_N/rank-R.json (mt_replay plays its collectives back)"},
      }));
  s.push_back(section<V>(
      "validation", &JobConfig::validation, "Loss on the held-out split during training.",
      {
          {"enable", &V::enable, "Compute the validation loss during training"},
          {"freq", &V::freq, "Validate every this many steps (> 0 when enabled)"},
          {"steps", &V::steps,
           "Batches per validation (of local_batch_size x data-parallel ranks sequences); -1 = "
           "every full batch of the split (the windows past the last are left out, so that set "
           "depends on the batch)",
           positive_or(-1)},
      }));
  s.push_back(section<E>(
      "embedding", &JobConfig::embedding,
      "Embedding tables of recommendation models (model.name = \"dlrm\"): their row "
      "optimizer, applied inside backward (fused) or as a row-sparse step, and their sharding.",
      {
          {"optimizer", &E::optimizer, "Row optimizer of the tables (FBGEMM's names)",
           one_of({"sgd", "rowwise_adagrad", "adam", "partial_rowwise_adam"})},
          {"lr", &E::lr, "Learning rate of the tables (constant; the schedule is for dense "
           "parameters)", positive()},
          {"eps", &E::eps, "Epsilon of Adagrad / Adam", non_negative()},
          {"weight_decay", &E::weight_decay, "Weight decay of the tables", non_negative()},
          {"beta1", &E::beta1, "Adam first-moment decay", in_half_open(0, 1)},
          {"beta2", &E::beta2, "Adam second-moment decay", in_half_open(0, 1)},
          {"gradient_mode", &E::gradient_mode,
           "fused: rows updated in backward, tables left out of clipping (as TorchRec); "
           "row_sparse: row-sparse gradients, clipped with the dense ones, then stepped",
           one_of({"fused", "row_sparse"})},
          {"sharding", &E::sharding,
           "auto: the planner picks per table; or one sharding type for every table",
           one_of({"auto", "data_parallel", "table_wise", "row_wise", "column_wise",
                   "table_row_wise"})},
          {"memory_budget_mb", &E::memory_budget_mb,
           "Per-rank memory the planner may give to tables and their optimizer state (MiB)",
           mebibytes()},
          {"managed_collision", &E::managed_collision,
           "Features whose raw ids are mapped to table rows by managed-collision hashing (an id "
           "keeps its row; a full bucket evicts and resets a row); the mapping is sharded over "
           "the ranks and checkpointed"},
          {"eviction", &E::eviction, "Which id a full managed-collision bucket evicts",
           one_of({"lru", "lfu"})},
          {"lookup_only", &E::lookup_only,
           "Managed-collision features that read the mapping without inserting (unknown ids are "
           "dropped from their bags)"},
          {"storage", &E::storage,
           "Where the tables' rows live: memory (tensors), or kv (RocksDB under kv_path with a "
           "row cache in front: tables larger than memory, trained exactly as memory tables)",
           one_of({"memory", "kv"})},
          {"storage_override", &E::storage_override,
           "Per-table storage, as \"<feature>:memory\" or \"<feature>:kv\""},
          {"update_override", &E::update_override,
           "Per-table update mode, as \"<feature>:train\" or \"<feature>:frozen\" (frozen: "
           "looked up only, no gradient or optimizer state)"},
          {"raw_ids", &E::raw_ids,
           "Features whose kv tables key rows by the raw 64-bit ids themselves (any id >= 0, "
           "e.g. hashed values), with no fixed row count; the feature's num_embeddings is then "
           "the rows the table is expected to hold (cache_fraction and the planner count it)"},
          {"kv_path", &E::kv_path,
           "Folder of the kv tables' stores, one per rank (rank-N; wiped at start: a resume "
           "refills them from the checkpoint); empty: <dump_folder>/kv"},
          {"cache_rows", &E::cache_rows,
           "Rows of each kv table shard's cache; 0: cache_fraction of the shard's rows",
           non_negative()},
          {"cache_fraction", &E::cache_fraction,
           "Cache rows as a fraction of each kv shard's rows (when cache_rows = 0)",
           custom("in (0, 1]", [](const Value& v) {
             const double x = std::get<double>(v);
             return x > 0 && x <= 1;
           })},
          {"cache_policy", &E::cache_policy, "Which row a full kv cache set evicts",
           one_of({"lru", "lfu"})},
          {"prefetch", &E::prefetch,
           "Read the next batch's kv rows from the store while the current step computes"},
          {"stream_to", &E::stream_to,
           "host:port of a serving replica (mt_embedding_server): every step's updated rows are "
           "sent to it in the background; empty: no stream"},
          {"stream_queue_mb", &E::stream_queue_mb,
           "Send queue of the stream (MiB); training waits for the replica only when it is full",
           mebibytes()},
          {"stream_state", &E::stream_state, "Also stream the rows' optimizer state"},
      }));
  s.push_back(section<N>(
      "comm", &JobConfig::comm, "Collective communication.",
      {
          {"timeout_seconds", &N::timeout_seconds,
           "A collective not finished after this long ends every rank with an error (at most a "
           "year: larger values overflowed the clock)",
           in_range(1, 365 * 24 * 3600)},
          {"trace", &N::trace,
           "Record every collective (group, mesh dim, bytes, time, busbw) to "
           "<dump_folder>/comm/rank-N.jsonl on every rank, show the exposed communication share "
           "in the step log and a summary at the end (mt_comm_report reads the folder)"},
      }));
  return s;
}

}  // namespace

std::string FieldSpec::key() const { return std::string(section) + "." + std::string(name); }

const FieldSpec* SectionSpec::find(std::string_view field) const {
  for (const FieldSpec& f : fields) {
    if (f.name == field) return &f;
  }
  return nullptr;
}

const std::vector<SectionSpec>& schema() {
  static const std::vector<SectionSpec> kSchema = build_schema();
  return kSchema;
}

const SectionSpec* find_section(std::string_view name) {
  for (const SectionSpec& s : schema()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::vector<const SectionSpec*> sections_in_group(std::string_view group) {
  std::vector<const SectionSpec*> out;
  for (const SectionSpec& s : schema()) {
    if (s.name.size() > group.size() && s.name.starts_with(group) && s.name[group.size()] == '.')
      out.push_back(&s);
  }
  return out;
}

bool is_section_group(std::string_view name) { return !sections_in_group(name).empty(); }

const FieldSpec* find_field(std::string_view key) {
  size_t dot = key.rfind('.');  // keys hold no dots; section names may
  if (dot == std::string_view::npos) return nullptr;
  const SectionSpec* s = find_section(key.substr(0, dot));
  return s ? s->find(key.substr(dot + 1)) : nullptr;
}

}  // namespace mt::train::config
