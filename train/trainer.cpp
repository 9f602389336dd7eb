#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <initializer_list>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "checkpoint/manager.h"
#include "data/dataset/loader.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "models/llama/generate.h"
#include "models/llama/model.h"
#include "models/llama/model_args.h"
#include "models/moe/model_args.h"
#include "models/parallel_context.h"
#include "models/registry.h"
#include "parallel/clip_grad.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/comm/nccl_process_group.h"
#include "parallel/comm/object_collectives.h"
#include "parallel/context/context_parallel.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/mesh/device_mesh.h"
#include "parallel/tensor/dtensor_ops.h"
#include "runtime/core/allocator.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/nn/init.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/float8_amax_notes.h"
#include "runtime/ops/reduce.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/optim/lr_scheduler.h"
#include "train/checkpointer.h"
#include "train/config_agreement.h"
#include "train/float8_setup.h"
#include "train/launch_layout.h"
#include "train/config/render.h"
#include "train/config/validate.h"
#include "train/metrics/eta.h"
#include "train/metrics/peak_flops.h"
#include "train/metrics/step_metrics.h"
#include "train/model_spec.h"
#include "train/optimizer_setup.h"
#include "train/pipeline_setup.h"
#include "parallel/pipeline/runner.h"
#include "train/run_scaffold.h"
#include "train/token_data.h"

namespace mt::train {

namespace fs = std::filesystem;
using runtime::Tensor;
using Clock = std::chrono::steady_clock;

namespace {

// A loader batch tensor on the training device. Through pinned memory the copy is queued and the
// host goes on; a copy from pageable memory would wait for everything queued on the stream (the
// previous micro-batch's backward).
Tensor batch_to_device(const Tensor& host, runtime::Device device) {
  return host.to(device, /*non_blocking=*/true);
}

// A lower bound of one micro-batch's memory, refused up front when it exceeds the machine's
// (local_batch_size = 1.8e16 used to end in std::bad_alloc after 18 s): the logits and their
// gradient in f32, B x T x vocab x 8 bytes (the tokenizer's vocab, padded as the model's: a
// model from a checkpoint has no smaller one).
// Checked against the host's RAM for CPU runs; device memory is not queried here.
void check_step_fits_in_memory(const config::JobConfig& job, int64_t vocab,
                               const runtime::Device& device) {
  if (!device.is_cpu()) return;
  // Context parallelism: each rank holds seq_len / cp tokens of every sequence.
  const double bytes = double(job.training.local_batch_size) * double(job.training.seq_len) /
                       double(job.parallelism.context_parallel_degree) * double(vocab) * 8.0;
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (ram <= 0 || bytes <= ram) return;
  std::ostringstream os;
  os << std::setprecision(3) << "train: one step needs at least " << bytes / double(1 << 30)
     << " GiB (the logits and their gradient: training.local_batch_size "
     << job.training.local_batch_size << " x training.seq_len " << job.training.seq_len
     << (job.parallelism.context_parallel_degree > 1
             ? " / context_parallel_degree " + std::to_string(job.parallelism.context_parallel_degree)
             : std::string())
     << " x vocab " << vocab
     << " x 8 bytes), more than this machine's " << ram / double(1 << 30)
     << " GiB of memory; lower training.local_batch_size (and raise global_batch_size for "
        "gradient accumulation) or training.seq_len";
  MT_FAIL(os.str());
}

}  // namespace

std::string describe_model(const config::JobConfig& job) {
  std::optional<int64_t> vocab;
  if (!job.model.tokenizer_path.empty())
    vocab = data::BpeTokenizer::from_file(job.model.tokenizer_path).vocab_size();
  const models::ModelSpec spec = model_spec_for(job, vocab, architecture_to_load(job));
  std::ostringstream os;
  os << "model " << spec.name << " " << spec.flavor << ": " << spec.num_params() << " parameters, "
     << spec.flops_per_token(job.training.seq_len) << " training FLOPs per token at seq_len "
     << job.training.seq_len << " (vocab "
     << (vocab ? "from " + job.model.tokenizer_path : std::string("of the flavor"))
     << (vocab && job.model.vocab_size_multiple_of > 1
             ? ", padded to a multiple of " + std::to_string(job.model.vocab_size_multiple_of)
             : std::string())
     << ")\n";
  return os.str();
}

Trainer::Trainer(config::JobConfig config, TrainerOptions options)
    : config_(std::move(config)), options_(std::move(options)) {
  const auto& tc = config_.training;
  parallel::set_collective_timeout(std::chrono::seconds(config_.comm.timeout_seconds));
  world_ = options_.world
               ? options_.world
               : std::shared_ptr<parallel::ProcessGroup>(parallel::MpiProcessGroup::world());
  if (rank() != 0) options_.write_files = false;  // rank 0 logs and writes for the job
  check_same_config_on_every_rank(config_, *world_);
  const config::WorldLayout layout = config::validate_for_world(config_, world_size());
  grad_accum_ = layout.grad_accum_steps;
  global_batch_size_ = layout.global_batch_size;
  tp_ = layout.tp;
  pp_ = layout.pp;
  cp_ = layout.cp;
  // The data-parallel ranks on the host: world ranks with the same pp and tp coordinates on the
  // mesh (pp, dp, cp, tp) (pp outermost, tp innermost). cp ranks hold different tokens of the
  // same sequences: their token counts and losses add up as the dp ranks' do.
  if (pp_ > 1 || cp_ > 1 || tp_ > 1) {
    const auto host = parallel::DeviceMesh::create(world_, {pp_, layout.dp, cp_, tp_},
                                                   {"pp", "dp", "cp", "tp"});
    dp_world_ = cp_ > 1 ? host->flatten({"dp", "cp"}, "dp_cp")->group_ptr(0) : host->group_ptr(1);
    if (pp_ > 1) {
      // Losses live on the last stage, once per tp group; load-balancing counts are summed over
      // the ranks of a stage (dp, cp and tp: those ranks route different tokens).
      loss_world_ = host->flatten({"pp", "dp", "cp"}, "pp_dp")->group_ptr(0);
      stage_world_ = host->flatten({"dp", "cp", "tp"}, "stage")->group_ptr(0);
      host_pp_group_ = host->group_ptr(0);
    }
  } else {
    dp_world_ = world_;
  }
  const RankPlacement placement =
      place_ranks(*world_, tc.device, config_.where("training.device"));
  device_ = placement.device;
  placement_text_ = placement.text;
  check_float8_device(config_, device_);  // before the data: "auto" may have resolved to a CPU
  const fs::path dump(config_.job.dump_folder);
  const fs::path checkpoints = dump / config_.checkpoint.folder;
  MT_CHECK(!config_.checkpoint.enable || !fs::exists(checkpoints) || fs::is_directory(checkpoints),
           "train: the checkpoint folder ", checkpoints.string(),
           " (job.dump_folder / checkpoint.folder) exists and is not a folder");
  if (rank() == 0) remove_incomplete_saves(config_, log());
  if (options_.write_files) config::write_config(config_, dump / "config.toml");

  // Tokenizer.
  const fs::path tok_path(config_.model.tokenizer_path);
  MT_CHECK(!tok_path.empty(),
           "train: model.tokenizer_path is empty; set it to a tokenizer.json (or its folder), "
           "e.g. one trained with mt_train_tokenizer");
  MT_CHECK(fs::exists(tok_path), "train: model.tokenizer_path ", tok_path.string(),
           " does not exist (", config_.where("model.tokenizer_path"),
           "); train one with mt_train_tokenizer --input CORPUS --output DIR");
  // Rank 0 notes what the tokenizer's file sets and minititan ignores (the log).
  tokenizer_ =
      std::make_unique<data::BpeTokenizer>(data::BpeTokenizer::from_file(tok_path, log()));
  check_step_fits_in_memory(config_, model_vocab_size(config_, tokenizer_->vocab_size()), device_);
  // The model's spec before the data: a model.name or flavor it cannot build fails at once, not
  // after the corpus is tokenized.
  spec_ = std::make_unique<models::ModelSpec>(model_spec_for(
      config_, tokenizer_->vocab_size(), architecture_to_load(config_), options_.edit_model_args));

  // Data.
  // Rank 0 tokenizes a text dataset (once, into the dump folder); the others then read its file.
  token_file_ = on_rank0_first("preparing the dataset", [&] {
    return resolve_token_file(tc.dataset_path, *tokenizer_, tok_path, dump, log());
  });
  data::LoaderOptions lo;
  lo.seq_len = tc.seq_len;
  lo.local_batch_size = tc.local_batch_size;
  lo.val_fraction = config_.validation.enable ? kValFraction : 0.0;
  lo.seed = uint64_t(tc.seed);
  // The ranks of one tp group (tp innermost), of one cp group (next) and of one pipeline read
  // the same batches.
  lo.rank = (rank() / (tp_ * cp_)) % layout.dp;
  lo.world_size = layout.dp;
  loader_ = std::make_unique<data::Loader>(token_file_, lo);
  MT_CHECK(loader_->num_train_windows() > 0, "train: the token file ", token_file_.string(),
           " holds ", loader_->info().num_tokens, " tokens: too few for one window of seq_len ",
           tc.seq_len, " + 1");
  const int64_t batch_windows = tc.local_batch_size * layout.dp;  // a micro-batch's, over dp
  MT_CHECK(!config_.validation.enable || loader_->num_val_batches() > 0,
           "train: validation.enable, but the token file ", token_file_.string(), " holds ",
           loader_->num_val_windows(), " validation window(s) of seq_len ", tc.seq_len,
           " (its last ", kValFraction * 100, "%), fewer than one batch (local_batch_size ",
           tc.local_batch_size, " x ", layout.dp,
           " data-parallel ranks): no validation would run; use more data, a smaller batch or "
           "seq_len, or validation.enable = false");
  if (loader_->num_train_windows() < batch_windows) {
    log() << "note: the token file holds " << loader_->num_train_windows()
          << " training windows of seq_len " << tc.seq_len << ", fewer than one batch over the "
          << "data-parallel ranks (" << batch_windows << "): windows repeat within every batch\n";
  }

  // Model.
  models::BuildOptions bo;
  bo.seed = uint64_t(tc.seed);
  const config::ActivationCheckpointConfig& ac = config_.activation_checkpoint;
  bo.activation_checkpoint =
      ac.mode == "selective" ? "selective:" + ac.selective_ac_option : ac.mode;  // validated
  // FSDP shards a model built on the host without values and moves this rank's shards to its
  // device, then each rank draws its shards only (the same values as the whole model's init):
  // no rank holds the whole model. The buffers (and an unsharded model) move after.
  if (tp_ > 1) {  // before any collective of the model's: a layout it cannot take is an error
    MT_CHECK(spec_->check_tensor_parallel != nullptr &&
                 (config_.parallelism.disable_loss_parallel || spec_->loss_with_cross_entropy),
             "train: model ", spec_->name,
             " has no tensor-parallel plan; set parallelism.tensor_parallel_degree = 1");
    spec_->check_tensor_parallel(tp_);
  }
  if (cp_ > 1) {
    MT_CHECK(spec_->shard_sequence != nullptr, "train: model ", spec_->name,
             " cannot run on sequence shards; set parallelism.context_parallel_degree = 1");
  }
  const bool shards = shards_parameters();
  if (pp_ > 1) {
    build_pipeline(plan_pipeline(config_, layout, *spec_), bo);
  } else {
    {
      std::optional<runtime::nn::DeferredInitGuard> no_values;
      if (shards) no_values.emplace();
      model_ = spec_->build(bo);  // on the CPU: initial weights do not depend on the device
    }
    // Float8 linears before parallelism, as torchtitan converts: FSDP gathers their weights
    // whole, so each GEMM scales the same tensors as on one rank.
    if (float8_enabled(config_)) float8_text_ = apply_float8_training(*model_, config_, device_);
    if (shards) {
      setup_parallelism();
      parallel::init_sharded_parameters(*model_, bo.seed);
    }
    model_->to(device_);
  }

  // Optimizer and schedule.
  optimizer_ = make_optimizer(config_.optimizer, model_->named_parameters());
  scheduler_ = make_lr_scheduler(config_.lr_scheduler, *optimizer_, tc.steps, &log());
  if (config_.checkpoint.enable || !config_.checkpoint.initial_load_path.empty()) {
    CheckpointedData data{[this] { return loader_->state().to_map(); },
                          [this](const std::map<std::string, int64_t>& s) {
                            loader_->load_state(data::LoaderState::from_map(s));
                          }};
    checkpointer_ = std::make_unique<TrainCheckpointer>(config_, world_, *model_, *optimizer_,
                                                        *scheduler_, std::move(data));
    if (spec_->architecture) checkpointer_->save_architecture(spec_->architecture());
    checkpointer_->set_global_batch(
        layout.global_batch_size,
        "sequences: local_batch_size " + std::to_string(tc.local_batch_size) + " x " +
            std::to_string(layout.dp) + " data-parallel rank(s) x " +
            std::to_string(grad_accum_) + " micro-batch(es)");
  }
}

Trainer::~Trainer() = default;

int64_t Trainer::rank() const { return world_->rank(); }
int64_t Trainer::world_size() const { return world_->size(); }

std::ostream& Trainer::log() const {
  if (options_.quiet || rank() != 0) return null_log_;
  return options_.log ? *options_.log : std::cout;
}

namespace {

runtime::DType dtype_from_config(const std::string& name) {
  if (name == "bfloat16") return runtime::DType::BF16;
  if (name == "float16") return runtime::DType::F16;
  return runtime::DType::F32;  // "float32" (the schema admits nothing else)
}

}  // namespace

runtime::DType Trainer::param_compute_dtype() const {
  return dtype_from_config(config_.training.mixed_precision_param);
}

bool Trainer::shards_parameters() const {
  // One rank in f32 has nothing to shard or cast: the model runs as built. So do the stages of a
  // pipeline without other ranks beside it (pp = the world) in f32.
  return world_size() / pp_ > 1 || config_.training.mixed_precision_param != "float32";
}

void Trainer::setup_parallelism() {
  device_world_ =
      device_.is_cpu()
          ? world_
          : std::shared_ptr<parallel::ProcessGroup>(parallel::make_nccl_process_group(world_));
  const config::WorldLayout layout = config::validate_for_world(config_, world_size());
  // FSDP shards over dp_shard and cp together (torchtitan's dp_shard_cp): cp ranks hold the same
  // parameters, and their gradients (of different tokens) add up as the dp ranks' do. On the
  // row-major mesh cp follows dp_shard, so one dim of their product holds the same ranks.
  const int64_t shard = layout.dp_shard * layout.cp;
  const std::string shard_dim = layout.cp > 1 ? "dp_shard_cp" : "dp_shard";
  if (layout.pp > 1) {  // (pp, dp_replicate, dp_shard, cp, tp), torchtitan's order
    const auto mesh =
        parallel::DeviceMesh::create(device_world_, {layout.pp, layout.dp_replicate, shard, layout.tp},
                                     {"pp", "dp_replicate", shard_dim, "tp"});
    dp_mesh_ = layout.dp_replicate > 1 ? mesh->submesh({"dp_replicate", shard_dim})
                                       : mesh->submesh({shard_dim});
    if (layout.tp > 1) {
      world_mesh_ = mesh->submesh({"dp_replicate", shard_dim, "tp"});  // one stage's ranks
      tp_mesh_ = mesh->submesh({"tp"});
    }
    pp_group_ = mesh->group_ptr(0);
  } else if (layout.tp > 1) {
    world_mesh_ = parallel::DeviceMesh::create(
        device_world_, {layout.dp_replicate, shard, layout.tp}, {"dp_replicate", shard_dim, "tp"});
    dp_mesh_ = layout.dp_replicate > 1 ? world_mesh_->submesh({"dp_replicate", shard_dim})
                                       : world_mesh_->submesh({shard_dim});
    tp_mesh_ = world_mesh_->submesh({"tp"});
  } else {
    dp_mesh_ = layout.dp_replicate > 1
                   ? parallel::DeviceMesh::create(device_world_, {layout.dp_replicate, shard},
                                                  {"dp_replicate", shard_dim})
                   : parallel::DeviceMesh::create(device_world_, {shard}, {shard_dim});
  }
  if (layout.cp > 1) {
    const auto mesh = parallel::DeviceMesh::create(
        device_world_, {layout.pp, layout.dp_replicate, layout.dp_shard, layout.cp, layout.tp},
        {"pp", "dp_replicate", "dp_shard", "cp", "tp"});
    const bool ring = config_.parallelism.context_parallel_rotate_method == "alltoall";
    context_parallel_ = std::make_unique<parallel::ContextParallel>(
        mesh->submesh({"cp"}), ring ? parallel::ContextParallelRotate::Ring
                                    : parallel::ContextParallelRotate::AllGather);
    sequence_positions_ = context_parallel_->positions(config_.training.seq_len, device_);
  }
  MT_CHECK(spec_->parallelize != nullptr, "train: model ", spec_->name,
           " cannot be parallelized (no parallelize hook)");
  const auto& p = config_.parallelism;
  models::ParallelContext ctx;
  ctx.dp_mesh = dp_mesh_;
  ctx.world_mesh = world_mesh_;
  ctx.tp_mesh = tp_mesh_;
  ctx.sequence_parallel = p.enable_sequence_parallel;
  ctx.loss_parallel = !p.disable_loss_parallel;
  if (layout.ep > 1) {  // ep borrows ranks from dp_shard x cp: efsdp = that / ep (validated)
    std::vector<int64_t> shape = {layout.dp_replicate, layout.ep, shard / layout.ep};
    std::vector<std::string> names = {"dp_replicate", "ep", "efsdp"};
    if (layout.tp > 1) {  // tp innermost, as on the world mesh
      shape.push_back(layout.tp);
      names.push_back("tp");
    }
    if (layout.pp > 1) {  // pp outermost, as on the world mesh; each stage its own expert mesh
      shape.insert(shape.begin(), layout.pp);
      names.insert(names.begin(), "pp");
    }
    expert_mesh_ = parallel::DeviceMesh::create(device_world_, shape, names);
    if (layout.pp > 1)
      expert_mesh_ = expert_mesh_->submesh(std::vector<std::string>(names.begin() + 1, names.end()));
    ctx.expert_mesh = expert_mesh_;
  }
  // "default": the blocks reshard when their shard group has several ranks (each gather saved is
  // memory given back). On one there is nothing to gather, and resharding would only trade the
  // blocks' compute-dtype copies (half the f32 weights' bytes) for casting them all again in the
  // backward, so they stay, as autocast keeps its casts between forward and backward.
  ctx.reshard_after_forward = p.fsdp_reshard_after_forward == "always" ||
                              (p.fsdp_reshard_after_forward == "default" && layout.dp_shard > 1);
  ctx.reshard_root_after_forward = p.fsdp_reshard_after_forward == "always";
  reshard_text_ = p.fsdp_reshard_after_forward + " (blocks: " +
                  (ctx.reshard_after_forward ? "yes" : "no") + ", root: " +
                  (ctx.reshard_root_after_forward ? "yes" : "no") + ")";
  ctx.mp_policy.param_dtype = param_compute_dtype();
  ctx.mp_policy.reduce_dtype = dtype_from_config(config_.training.mixed_precision_reduce);
  ctx.float8_all_gather = config_.float8.enable && config_.float8.enable_fsdp_float8_all_gather;
  ctx.gradient_divide_factor = 1.0;  // the loss is normalised by the global token count
  if (pp_ > 1) {
    for (const auto& stage : stage_modules_) spec_->parallelize(*stage, ctx);
  } else {
    spec_->parallelize(*model_, ctx);
  }
}

template <class Fn>
auto Trainer::on_rank0_first(const char* what, Fn&& fn) -> decltype(fn()) {
  if (world_size() == 1) return fn();
  std::optional<decltype(fn())> result;
  std::string error;
  if (rank() == 0) {
    try {
      result = fn();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  // Rank 0's outcome reaches every rank, so a failure there is an error everywhere, not a hang.
  // The others wait for it without a time limit: preparing a large dataset can take longer than
  // [comm] timeout_seconds (a rank 0 that dies still ends the job through the launcher).
  bool failed = false;
  {
    parallel::ScopedCollectiveTimeout no_limit(std::chrono::milliseconds(0));
    failed = sum_over_ranks(error.empty() ? 0.0 : 1.0, "train.rank0_first") > 0;
  }
  if (rank() == 0 && failed) MT_FAIL(error);
  MT_CHECK(!failed, "train: rank 0 failed while ", what, " (its message is in its output)");
  if (rank() != 0) result = fn();
  return *result;
}

double Trainer::sum_over_ranks(double value, const char* name) const {
  return train::sum_over_ranks(*world_, value, name);
}

double Trainer::sum_over_dp(double value, const char* name) const {
  return train::sum_over_ranks(*dp_world_, value, name);
}

double Trainer::sum_losses(double value, const char* name) const {
  return pp_ > 1 ? train::sum_over_ranks(*loss_world_, value, name) : sum_over_dp(value, name);
}

Tensor Trainer::batch_loss(const Tensor& inputs, const Tensor& labels,
                           runtime::Reduction reduction) const {
  if (tp_mesh_ == nullptr || config_.parallelism.disable_loss_parallel)
    return spec_->loss(*model_, inputs, labels, reduction);
  return spec_->loss_with_cross_entropy(
      *model_, inputs, labels, reduction,
      [this](const Tensor& logits, const Tensor& targets, runtime::Reduction r) {
        return logits_loss(logits, targets, r);
      });
}

Tensor Trainer::logits_loss(const Tensor& logits, const Tensor& labels,
                            runtime::Reduction reduction) const {
  if (tp_mesh_ == nullptr || config_.parallelism.disable_loss_parallel) {
    return runtime::cross_entropy(logits, labels, -100, reduction,
                                  runtime::accumulation_dtype(logits.dtype()));
  }
  // Loss parallel: the logits are this rank's vocab columns.
  return parallel::dtensor::vocab_parallel_cross_entropy(
      logits, labels, tp_mesh_, vocab_size_of(*spec_).value_or(tokenizer_->vocab_size()), -100,
      reduction);
}

int64_t Trainer::num_params() const { return spec_->num_params(); }

struct Trainer::StepValues {
  Tensor loss_sum;      // the micro-batches' summed token losses, on the training device
  double valid = 0.0;   // valid tokens over every rank: loss = sum over ranks of loss_sum / valid
  Tensor grad_norm;     // on the device; undefined where the norm was read at once
  double host_grad_norm = 0.0;
  bool skipped = false;  // the norm was read at once and not finite: no optimizer update
  std::map<std::string, double> model_metrics;  // the model's after_optimizer_step hook
};

namespace {
// [quantize.linear.float8] precompute_float8_dynamic_scale_for_fsdp: the float8 weights' amaxes
// in one all-reduce for the step's gathers, dropped when the step ends (the weights change).
class Float8ScalesForStep {
 public:
  Float8ScalesForStep(runtime::nn::Module& model, bool on) : model_(model), on_(on) {
    if (on_) parallel::precompute_float8_scales(model_);
  }
  ~Float8ScalesForStep() {
    if (on_) parallel::clear_float8_scales(model_);
  }
  Float8ScalesForStep(const Float8ScalesForStep&) = delete;
  Float8ScalesForStep& operator=(const Float8ScalesForStep&) = delete;

 private:
  runtime::nn::Module& model_;
  bool on_;
};
}  // namespace

Trainer::StepValues Trainer::train_step() {
  const Float8ScalesForStep float8_scales(
      *model_, config_.float8.enable && config_.float8.precompute_float8_dynamic_scale_for_fsdp);
  // All micro-batches first: the loss is normalised by their total count of valid tokens.
  std::vector<data::Batch> batches;
  batches.reserve(size_t(grad_accum_));
  int64_t local_valid = 0;
  for (int64_t i = 0; i < grad_accum_; ++i) {
    batches.push_back(shard_sequences(loader_->next()));
    for (int64_t t : batches.back().labels.to_vector<int64_t>()) local_valid += t != -100;
    batches.back().inputs = batch_to_device(batches.back().inputs, device_);
    batches.back().labels = batch_to_device(batches.back().labels, device_);
  }
  StepValues values;
  values.valid = sum_over_dp(double(local_valid), "train.valid_tokens");
  MT_CHECK(values.valid > 0, "train: a step's batches hold no valid label");
  optimizer_->zero_grad();
  {
    const SequenceShardScope sharded(*this);  // backward too: recomputed blocks attend alike
    // Tensorwise float8: the norms and SwiGLU measure the amaxes of the linears' inputs and
    // output gradients as they write them, and the casts skip their own pass over those.
    std::optional<runtime::Float8AmaxNotes> float8_amaxes;
    if (config_.float8.enable && config_.float8.recipe_name == "tensorwise")
      float8_amaxes.emplace();
    for (const data::Batch& b : batches) {
      Tensor sum;
      if (pipeline_) {
        sum = pipeline_batch_loss(b.inputs, b.labels, values.valid);
      } else {
        sum = batch_loss(b.inputs, b.labels, runtime::Reduction::Sum);
        (sum * (1.0 / values.valid)).backward();
      }
      values.loss_sum =
          values.loss_sum.defined() ? runtime::add(values.loss_sum, sum.detach()) : sum.detach();
    }
  }
  // On the CPU the norm is read at once (and gradients under max_norm are not touched); on a GPU
  // it stays on the device, so the host queues the whole step without waiting for it, and the
  // clipping coefficient goes to the optimizer, which applies it as it reads the gradients (no
  // pass over them of its own).
  // A non-finite norm seen here skips the update (the weights stay finite); on a GPU it is read
  // here only when skipping is allowed, else at the next read of the step (read_steps).
  Tensor clip_scale;
  if (device_.is_cpu()) {
    values.host_grad_norm = parallel::clip_grad_norm_(parallel::distributed_parameters(*model_),
                                                      config_.training.max_norm, 2.0, false,
                                                      pp_group_.get());
    values.skipped = !std::isfinite(values.host_grad_norm);
  } else {
    values.grad_norm = parallel::total_grad_norm_tensor(
        parallel::distributed_parameters(*model_), 2.0, pp_group_.get());
    clip_scale = runtime::optim::clip_coefficient(values.grad_norm, config_.training.max_norm);
    if (config_.training.skip_nonfinite_steps > 0) {
      values.host_grad_norm = values.grad_norm.item<double>();
      values.grad_norm = Tensor();
      values.skipped = !std::isfinite(values.host_grad_norm);
    }
  }
  if (values.skipped) {
    scheduler_->step();  // the schedule follows the steps (and the data), updated or not
    return values;
  }
  optimizer_->step(clip_scale);
  scheduler_->step();
  if (spec_->after_optimizer_step) values.model_metrics = after_optimizer_step();
  return values;
}

std::map<std::string, double> Trainer::after_optimizer_step() {
  // Counts are summed over the ranks holding the same layers: every rank, or with a pipeline the
  // ranks of this stage.
  parallel::ProcessGroup& holders = pp_ > 1 ? *stage_world_ : *world_;
  const auto all_reduce_sum = [&holders](Tensor& t) {
    if (holders.size() == 1) return;
    Tensor host = t.device().is_cpu() ? t : t.to(runtime::Device::cpu());
    holders.all_reduce(host, parallel::ReduceOp::Sum, "train.model_counts");
    if (!t.device().is_cpu()) t.copy_(host);
  };
  if (pp_ == 1) return spec_->after_optimizer_step(*model_, all_reduce_sum);
  std::ostringstream mine;
  mine << std::setprecision(17);
  for (const auto& stage : stage_modules_)
    for (const auto& [name, value] : spec_->after_optimizer_step(*stage, all_reduce_sum))
      mine << name << '\t' << value << '\n';
  // Every stage's metrics (ModelSpec::after_optimizer_step): a mean over layers is recomputed
  // from the layers' values of all stages.
  std::map<std::string, double> metrics;
  for (const std::string& text :
       parallel::all_gather_strings(*host_pp_group_, mine.str(), "train.model_metrics")) {
    std::istringstream lines(text);
    std::string name;
    double value = 0;
    while (std::getline(lines, name, '\t') && lines >> value) {
      lines.ignore(1);
      metrics[name] = value;
    }
  }
  for (auto& [name, value] : metrics) {
    double sum = 0;
    int64_t layers = 0;
    for (auto it = metrics.lower_bound(name + "_layer");
         it != metrics.end() && it->first.starts_with(name + "_layer"); ++it, ++layers)
      sum += it->second;
    if (layers > 0) value = sum / double(layers);
  }
  return metrics;
}

void Trainer::read_steps(std::vector<StepValues>& unread, int64_t last_step,
                         TrainResult& result) const {
  int64_t step = last_step - int64_t(unread.size());
  for (StepValues& v : unread) {  // every rank reads the same steps: the sums pair up
    ++step;
    result.losses.push_back(sum_losses(v.loss_sum.item<double>(), "train.loss") / v.valid);
    result.grad_norms.push_back(v.grad_norm.defined() ? v.grad_norm.item<double>()
                                                      : v.host_grad_norm);
    result.model_metrics.push_back(std::move(v.model_metrics));
    // Skipped steps were handled when they ran; any other non-finite step already updated.
    if (!v.skipped && !(std::isfinite(result.losses.back()) &&
                        std::isfinite(result.grad_norms.back()))) {
      fail_nonfinite(step, result.losses.back(), result.grad_norms.back());
    }
  }
  unread.clear();
}

namespace {

// "nan" (never "-nan"), "inf", "-inf", or the number.
std::string number_text(double x) {
  if (std::isnan(x)) return "nan";
  std::ostringstream os;
  os << x;
  return os.str();
}

}  // namespace

void Trainer::fail_nonfinite(int64_t step, double loss, double grad_norm) const {
  std::string last;
  if (config_.checkpoint.enable) {
    if (checkpointer_) checkpointer_->finish();
    const std::vector<int64_t> saved = checkpoint::complete_checkpoint_steps(
        fs::path(config_.job.dump_folder) / config_.checkpoint.folder);
    if (!saved.empty()) {
      last = "; the last checkpoint is " +
             (fs::path(config_.job.dump_folder) / config_.checkpoint.folder /
              ("step-" + std::to_string(saved.back())))
                 .string();
    }
  }
  std::ostringstream os;
  os << "train: step " << step << ": the loss is " << number_text(loss)
     << " and the gradient norm " << number_text(grad_norm) << " (not finite): stopping" << last
     << ". Lower optimizer.lr (it is " << config_.optimizer.lr
     << ") or raise [training] skip_nonfinite_steps (it is "
     << config_.training.skip_nonfinite_steps << ") to skip such steps";
  MT_FAIL(os.str());
}

std::optional<double> Trainer::validation_loss(int64_t max_batches) const {
  const int64_t available = loader_->num_val_batches();
  if (available == 0) return std::nullopt;
  const int64_t n = max_batches < 0 ? available : std::min(available, max_batches);
  runtime::NoGradGuard no_grad;
  const SequenceShardScope sharded(*this);
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t k = 0; k < n; ++k) {
    const data::Batch b = shard_sequences(loader_->val_batch(k));
    const Tensor inputs = batch_to_device(b.inputs, device_);
    const Tensor labels = batch_to_device(b.labels, device_);
    const Tensor loss = pipeline_ ? pipeline_eval_loss(inputs, labels)
                                  : batch_loss(inputs, labels, runtime::Reduction::Sum);
    sum += loss.item<double>();
    for (int64_t t : b.labels.to_vector<int64_t>()) count += t != -100;
  }
  // Every rank holds the same number of validation batches (full global batches only).
  sum = sum_losses(sum, "validate.loss");
  const double total = sum_over_dp(double(count), "validate.tokens");
  return total > 0 ? std::optional<double>(sum / total) : std::nullopt;
}

TrainResult Trainer::train() {
  const auto& tc = config_.training;
  std::ostream& out = log();
  RunScaffold run(config_, options_, *world_, checkpointer_.get(), out);

  // Per rank: tokens/s and MFU in the log are per rank (per device), as torchtitan reports them.
  const int64_t tokens_per_step = grad_accum_ * tc.local_batch_size * tc.seq_len;
  const double flops_per_token = spec_->flops_per_token(tc.seq_len);
  const std::optional<double> peak = mfu_peak_flops();
  log_run_header(out, tokens_per_step, flops_per_token, peak);

  TrainResult result;
  // Between logged steps the host runs ahead of a GPU, so a step's own time is spread over the
  // steps up to the next logged one: the average covers at least one such window.
  EtaEstimator eta(tc.steps, 3, size_t(std::max<int64_t>(20, config_.metrics.log_freq)));
  const int width = step_width_for(tc.steps);
  double window_seconds = 0.0, window_wait = 0.0;
  int64_t window_steps = 0;
  double last_wait = loader_->data_wait_seconds();
  auto run_validation = [&](int64_t step) {
    const auto v = validation_loss(config_.validation.steps);
    if (!v) return;
    result.val_losses.emplace_back(step, *v);
    out << "validate step " << std::setw(width) << step << "  val_loss " << std::fixed
        << std::setprecision(4) << *v << "  (perplexity " << std::setprecision(1) << std::exp(*v)
        << ")\n"
        << std::defaultfloat << std::flush;
    run.log_values(step, {{"val_loss", *v}});
  };

  const ResumePoint resumed = checkpointer_ ? checkpointer_->resume(out) : ResumePoint{};
  int64_t tokens_seen = resumed.tokens_seen;
  result.first_step = resumed.step + 1;
  if (resumed.step >= tc.steps) {
    out << "nothing to train: the checkpoint is at step " << resumed.step << " of " << tc.steps
        << "\n";
  }
  std::vector<StepValues> unread;  // steps whose loss the host has not read yet
  for (int64_t step = resumed.step + 1; step <= tc.steps; ++step) {
    const auto t0 = Clock::now();
    const double lr = optimizer_->lr();
    run.profile_begin(step, device_);
    unread.push_back(train_step());
    run.profile_end(step);
    if (unread.back().skipped) {
      result.skipped_steps.push_back(step);
      if (int64_t(result.skipped_steps.size()) > tc.skip_nonfinite_steps) {
        const double loss =
            sum_over_ranks(unread.back().loss_sum.item<double>(), "train.loss") /
            unread.back().valid;
        fail_nonfinite(step, loss, unread.back().host_grad_norm);
      }
      out << "warning: step " << step << ": the gradient norm is "
          << number_text(unread.back().host_grad_norm) << ": skipped, no update ("
          << result.skipped_steps.size() << " of " << tc.skip_nonfinite_steps
          << " allowed by [training] skip_nonfinite_steps)\n";
    }
    const bool log_line = step == 1 || step % config_.metrics.log_freq == 0 || step == tc.steps;
    // The losses are read before a checkpoint is saved too, so no save holds a non-finite step.
    const bool save_due = config_.checkpoint.enable && step % config_.checkpoint.interval == 0;
    // The wait for the device, at a logged step: the window's time is the steps' wall time.
    if (log_line || save_due) read_steps(unread, step, result);
    const double dt = seconds_since(t0);
    const double wait_now = loader_->data_wait_seconds();
    window_wait += wait_now - last_wait;
    last_wait = wait_now;
    window_seconds += dt;
    ++window_steps;
    eta.record(dt);
    result.steps_done = step;
    tokens_seen += tokens_per_step * (world_size() / ranks_per_batch());

    if (log_line) {
      StepMetrics m;
      m.step = step;
      m.loss = result.losses.back();
      m.grad_norm = result.grad_norms.back();
      m.lr = lr;
      // A tp group, a cp group and a pipeline share their batch: each of their devices counts
      // its share (torchtitan's rule).
      m.tokens_per_sec = double(window_steps * tokens_per_step) / double(ranks_per_batch()) /
                         std::max(window_seconds, 1e-9);
      m.ranks = world_size();
      m.mfu = mfu(flops_per_token, m.tokens_per_sec, peak);
      const runtime::MemoryStats mem = runtime::memory_stats(device_);
      m.mem_in_use_bytes = mem.bytes_in_use;
      m.mem_peak_bytes = mem.peak_bytes_in_use;
      m.data_wait_fraction = window_wait / std::max(window_seconds, 1e-9);
      m.comm_exposed_fraction = run.take_comm_exposed_fraction();
      m.elapsed_sec = run.elapsed_seconds();
      m.eta_sec = eta.eta(step);
      m.model_metrics = result.model_metrics.back();
      out << format_step_line(m, width) << "\n" << std::flush;
      run.log_step(m);
      window_seconds = window_wait = 0.0;
      window_steps = 0;
    }
    if (config_.validation.enable && (step % config_.validation.freq == 0 || step == tc.steps))
      run_validation(step);
    if (run.end_of_step(step, tokens_seen, result)) break;
  }
  read_steps(unread, result.steps_done, result);  // a stop between logged steps
  run.finish(result);
  out << "\n" << std::flush;

  // Sampling is the model's incremental decoding (models/llama/generate.h); models without it
  // skip it.
  if (!result.stopped_by_signal && options_.sample_tokens > 0 && can_sample()) {
    result.sample = generate_sample(options_.sample_prompt, options_.sample_tokens);
    out << "sample (temperature 0.8, top-k 40):\n"
        << options_.sample_prompt << result.sample << "\n"
        << std::flush;
  }
  return result;
}

}  // namespace mt::train
