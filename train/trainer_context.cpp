// Context parallelism in the trainer (parallelism.context_parallel_degree > 1): each rank of a
// cp group takes its share of every sequence of the batches (parallel/context), and the model
// runs on those shards during training steps and validation (ModelSpec::shard_sequence).
#include "data/dataset/loader.h"
#include "models/registry.h"
#include "parallel/context/context_parallel.h"
#include "train/trainer.h"

namespace mt::train {

data::Batch Trainer::shard_sequences(data::Batch batch) const {
  if (!context_parallel_) return batch;
  batch.inputs = context_parallel_->shard(batch.inputs);
  batch.labels = context_parallel_->shard(batch.labels);
  return batch;
}

std::vector<runtime::nn::Module*> Trainer::model_parts() const {
  if (pp_ == 1) return {model_.get()};
  std::vector<runtime::nn::Module*> parts;
  for (const auto& stage : stage_modules_) parts.push_back(stage.get());
  return parts;
}

Trainer::SequenceShardScope::SequenceShardScope(const Trainer& trainer) : trainer_(trainer) {
  if (!trainer_.context_parallel_) return;
  const parallel::ContextParallel* cp = trainer_.context_parallel_.get();
  models::SequenceShard shard{trainer_.sequence_positions_,
                              [cp](const runtime::Tensor& q, const runtime::Tensor& k,
                                   const runtime::Tensor& v) { return cp->attention(q, k, v); },
                              cp->degree(),
                              [cp](runtime::Tensor& t) { cp->sum_over_shards(t); }};
  for (runtime::nn::Module* part : trainer_.model_parts()) trainer_.spec_->shard_sequence(*part, shard);
}

Trainer::SequenceShardScope::~SequenceShardScope() {
  if (!trainer_.context_parallel_) return;
  for (runtime::nn::Module* part : trainer_.model_parts())
    trainer_.spec_->shard_sequence(*part, std::nullopt);
}

}  // namespace mt::train
