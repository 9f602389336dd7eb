// The trainer's pipeline-parallel pieces (parallelism.pipeline_parallel_degree > 1): this rank's
// stages built, converted to float8 and sharded as the whole model would be, the PipelineRunner
// that moves micro-batches between the stages, and the step's loss summed over the micro-batches
// on the last stage's ranks (zero elsewhere), scaled as the loss without a pipeline.
#include <optional>
#include <vector>

#include "models/registry.h"
#include "parallel/comm/nccl_process_group.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/mesh/device_mesh.h"
#include "parallel/pipeline/runner.h"
#include "runtime/nn/init.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "train/float8_setup.h"
#include "train/model_spec.h"
#include "train/pipeline_setup.h"
#include "train/trainer.h"

namespace mt::train {

using runtime::Tensor;

void Trainer::build_pipeline(const PipelinePlan& plan, const models::BuildOptions& build) {
  namespace pipe = parallel::pipeline;
  const bool shards = shards_parameters();
  const int64_t pp_rank = rank() / (world_size() / pp_);  // pp is the outermost mesh dimension
  std::vector<pipe::LocalStage> local;
  for (int64_t s = 0; s < plan.schedule.num_stages(); ++s) {
    if (pipe::stage_rank(s, pp_) != pp_rank) continue;
    {
      // Only this stage's parameters are built: without values when FSDP shards them (each rank
      // then draws its shards), else initialised as in the whole model (keyed by FQN).
      std::optional<runtime::nn::DeferredInitGuard> no_values;
      if (shards) no_values.emplace();
      stage_modules_.push_back(
          spec_->build_stage(build, plan.stages[size_t(s)].begin, plan.stages[size_t(s)].end));
    }
    local.push_back({s, stage_modules_.back()});
  }
  // Float8 linears before parallelism, as without a pipeline (each rank converts its stages).
  if (float8_enabled(config_)) {
    std::vector<runtime::nn::Module*> stages;
    for (const auto& stage : stage_modules_) stages.push_back(stage.get());
    float8_text_ = apply_float8_training(stages, config_, device_) + " (this rank's stages)";
  }
  if (shards) {
    setup_parallelism();
  } else {  // the stages' ranks alone (pp = the world): only the pp group
    const auto world = device_.is_cpu() ? world_
                                        : std::shared_ptr<parallel::ProcessGroup>(
                                              parallel::make_nccl_process_group(world_));
    pp_group_ = parallel::DeviceMesh::create(world, {pp_, world_size() / pp_}, {"pp", "dp_shard"})
                    ->group_ptr(0);
  }
  for (const auto& stage : stage_modules_) {
    if (shards) parallel::init_sharded_parameters(*stage, build.seed);
    stage->to(device_);
  }
  model_ = pipe::merge_stage_modules(stage_modules_);
  pipe::StageFunctions functions;
  functions.forward = [forward = spec_->stage_forward](runtime::nn::Module& stage,
                                                       const Tensor& input) {
    const models::ModelSpec::StageOutput out = forward(stage, input);
    return pipe::StageOutput{out.hidden, out.aux_loss};
  };
  functions.aux_loss = [this](const Tensor& aux, int64_t microbatch) {
    // As the model's loss adds it without a pipeline (moe spec.cpp): the auxiliary loss times the
    // micro-batch's valid tokens, in the loss's accumulation dtype, logged with the loss on this
    // stage's rank (the ranks' sums add up to the step's loss) and differentiated / the step's
    // valid tokens.
    const Tensor valid =
        runtime::sum(runtime::ne(pipeline_labels_.at(size_t(microbatch)), -100.0));
    const runtime::DType dt = runtime::accumulation_dtype(aux.dtype());
    return add_to_pipeline_loss(runtime::mul(aux.to(dt), valid.to(dt)));
  };
  functions.loss = [this](const Tensor& logits, int64_t microbatch) {
    // The token cross-entropy of the last stage's logits, summed, as the model's loss computes
    // it; its gradient is taken of sum / (the step's valid tokens), as without a pipeline.
    const Tensor sum =
        logits_loss(logits, pipeline_labels_.at(size_t(microbatch)), runtime::Reduction::Sum);
    return add_to_pipeline_loss(sum);
  };
  const auto hidden = runtime::TensorOptions{}
                          .with_dtype(param_compute_dtype())
                          .with_device(device_);
  // Between stages the residual stream is local: with sequence parallelism each tp rank sends
  // its sequence shard to the same tp rank of the next stage.
  // With context parallelism the stages pass this rank's share of each sequence.
  const bool sequence_shards = tp_ > 1 && config_.parallelism.enable_sequence_parallel;
  pipeline_ = std::make_unique<pipe::PipelineRunner>(
      plan.schedule, pp_group_, std::move(local), std::move(functions),
      spec_->hidden_shape(config_.parallelism.pipeline_parallel_microbatch_size,
                          config_.training.seq_len / cp_ / (sequence_shards ? tp_ : 1)),
      hidden);
}

namespace {

// A batch's rows in micro-batches of `size` (a divisor of its rows, validated with the config).
std::vector<Tensor> split_microbatches(const Tensor& batch, int64_t size) {
  std::vector<Tensor> parts;
  for (int64_t start = 0; start < batch.size(0); start += size)
    parts.push_back(batch.narrow(0, start, size).contiguous());
  return parts;
}

// Ranks without the last stage hold no loss: they add zero to the sum over ranks.
Tensor loss_or_zero(const Tensor& loss, runtime::Device device) {
  if (loss.defined()) return loss;
  return runtime::zeros({}, runtime::TensorOptions{}.with_dtype(runtime::DType::F32)
                                .with_device(device));
}

}  // namespace

Tensor Trainer::add_to_pipeline_loss(const Tensor& term) {
  pipeline_loss_sum_ =
      pipeline_loss_sum_.defined() ? runtime::add(pipeline_loss_sum_, term.detach()) : term.detach();
  return term * (1.0 / pipeline_valid_);
}

Tensor Trainer::pipeline_batch_loss(const Tensor& inputs, const Tensor& labels, double valid) {
  const int64_t size = config_.parallelism.pipeline_parallel_microbatch_size;
  pipeline_labels_ = split_microbatches(labels, size);
  pipeline_valid_ = valid;
  pipeline_loss_sum_ = Tensor();
  pipeline_->step(split_microbatches(inputs, size));
  Tensor sum = pipeline_loss_sum_;
  pipeline_loss_sum_ = Tensor();
  pipeline_labels_.clear();
  return loss_or_zero(sum, device_);
}

Tensor Trainer::pipeline_eval_loss(const Tensor& inputs, const Tensor& labels) const {
  const int64_t size = config_.parallelism.pipeline_parallel_microbatch_size;
  const std::vector<Tensor> targets = split_microbatches(labels, size);
  const Tensor sum = pipeline_->forward_only(
      split_microbatches(inputs, size), [&](const Tensor& logits, int64_t microbatch) {
        return logits_loss(logits, targets.at(size_t(microbatch)), runtime::Reduction::Sum);
      });
  return loss_or_zero(sum, device_);
}

}  // namespace mt::train
