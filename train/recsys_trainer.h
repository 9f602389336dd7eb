// RecsysTrainer: the `train` binary's loop for recommendation models (model.name = "dlrm"), as
// Trainer is for language models: batches of dense features, sparse features (a
// KeyedJaggedTensor) and a binary label instead of token windows.
//
//   JobConfig config = config::load_config("configs/dlrm_movielens.toml", {});
//   RecsysTrainer trainer(config);
//   TrainResult result = trainer.train();   // losses, grad norms, held-out loss and AUC
//
// The config, by section:
//   [model]       name = "dlrm", flavor (models/dlrm/model_args.h: movielens_small, criteo_small);
//                 the dataset's table sizes replace the flavor's (the feature names must match).
//   [training]    dataset ("movielens" or "synthetic_criteo", data/recsys/dataset.h),
//                 dataset_path (the ml-100k folder), local_batch_size (samples per rank), steps,
//                 seed (weights, data order), max_norm, device (cuda: the tables and MLPs
//                 train on the GPU; the ids are routed on the host, see below).
//                 mixed_precision_param must be float32 (tables and MLPs train in float32);
//                 seq_len, tokenizer_path and activation checkpointing do not apply.
//   [optimizer], [lr_scheduler]   the dense parameters (MLPs, cross net).
//   [embedding]   the tables: row optimizer and its constant lr, gradient mode, sharding; the
//                 managed_collision features' raw ids are mapped to rows (runtime/sparse/
//                 managed_collision.h, sharded by buckets over the ranks), evicted rows reset;
//                 held-out batches read the mapping without changing it.
//   [validation]  every freq steps: mean BCE and ROC AUC over the held-out split (steps = -1: all
//                 of it; the AUC is over every rank's scores, the same for any world size).
//   [checkpoint]  as for language models (train/checkpointer.h). The tables are saved in global
//                 coordinates as model.sparse_arch.embedding_bags.<table>.weight (the unsharded
//                 model's names) and their row optimizer's state as table_optimizer.state.<...>
//                 (train/embedding_checkpoint.h), so a run saved on N ranks resumes on M ranks
//                 with another plan; exclude_from_loading = ["optimizer.", "table_optimizer."]
//                 restarts both optimizers. The managed-collision mapping is saved in global
//                 rows as model.managed_collision.<table>.row_ids / row_meta. The data position
//                 is global, too.
//   [metrics]     the step line (samples/s instead of tok/s), metrics.jsonl, loss.svg.
// Ranks: every rank is a data-parallel rank reading its own rows of each global batch. On more
// than one rank the tables are sharded by a plan (the planner under [embedding] memory_budget_mb,
// or one sharding type for all; printed) and the dense layers are FSDP-sharded over all ranks
// (models/dlrm/parallelize.h). Each rank backpropagates its samples' BCE sum / global batch, so N
// ranks train like one process over the global batch (same losses to float tolerance).
// GPUs (one per rank): the tables, their lookups, row optimizers and the dense layers run on the
// GPU; the ids are checked and routed on the host over MPI, the tables' pooled outputs are
// exchanged and FSDP reduces over NCCL.
// Fused tables are updated inside backward and are not clipped (logged at start); row_sparse
// tables are clipped with the dense parameters, then stepped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "data/recsys/dataset.h"
#include "runtime/sparse/kv/kv_table.h"
#include "train/config/job_config.h"
#include "train/train_result.h"
#include "train/trainer.h"

namespace mt::data::recsys {
class RecsysDataset;
}
namespace mt::models::dlrm {
class Dlrm;
}
namespace mt::parallel {
class ShardedEmbeddingBagCollection;
class ShardedManagedCollisionCollection;
class RowStreamClient;
class SharedLog;
}  // namespace mt::parallel
namespace mt::runtime::sparse {
class KeyedJaggedTensor;
}

namespace mt::train {

// Whether `model_name` is trained by RecsysTrainer (else by Trainer).
bool is_recsys_model(const std::string& model_name);
std::vector<std::string> recsys_model_names();  // the names is_recsys_model accepts
// One line: dense and table parameter counts of the job's flavor (`train --describe-model`).
std::string describe_recsys_model(const config::JobConfig& job);

struct HeldOutMetrics {
  double loss = 0.0;  // mean BCE over the held-out samples
  std::optional<double> auc;  // ROC AUC over them; none when they are all of one class
  int64_t samples = 0;
};

class RecsysTrainer {
 public:
  // TrainerOptions: log, quiet, handle_signals, write_files, world and edit_model_args (gets a
  // models::dlrm::ModelArgs) apply; the sampling options do not.
  explicit RecsysTrainer(config::JobConfig config, TrainerOptions options = {});
  ~RecsysTrainer();
  RecsysTrainer(const RecsysTrainer&) = delete;
  RecsysTrainer& operator=(const RecsysTrainer&) = delete;

  TrainResult train();  // training.steps optimizer steps (or until a stop signal)

  // Collective. Loss and AUC over `max_batches` held-out global batches (-1: all of them).
  HeldOutMetrics evaluate(int64_t max_batches) const;

  const config::JobConfig& config() const { return config_; }
  int64_t rank() const;
  int64_t world_size() const;
  models::dlrm::Dlrm& model() const { return *model_; }

 private:
  std::ostream& log() const;
  struct StepValues;
  // One optimizer step. Its loss (and, on a GPU with fused tables, its gradient norm) stays on the
  // device: the host reads them at logged steps (read_steps), queueing the steps in between.
  StepValues train_step(int64_t step);
  // Reads the steps' global mean losses and norms, in order, into result and clears `unread`.
  // Collective (every rank reads the same steps).
  void read_steps(std::vector<StepValues>& unread, TrainResult& result) const;
  // The batch's sparse features with managed-collision ids mapped to rows (evicted rows reset);
  // `features` itself when no feature is managed. Collective.
  runtime::sparse::KeyedJaggedTensor map_ids(const runtime::sparse::KeyedJaggedTensor& features,
                                             int64_t step) const;
  parallel::ShardedEmbeddingBagCollection& tables() const;
  void setup_managed_collision();
  // [embedding] stream_to: waits (bounded) for the replica, then logs what it got and missed.
  void finish_stream(std::ostream& out) const;

  config::JobConfig config_;
  TrainerOptions options_;
  std::shared_ptr<parallel::ProcessGroup> world_;
  std::unique_ptr<data::recsys::RecsysDataset> data_;
  std::shared_ptr<models::dlrm::Dlrm> model_;
  runtime::Device device_;                         // [training] device, resolved
  std::shared_ptr<parallel::DeviceMesh> dp_mesh_;  // null on one rank
  std::string plan_text_;                          // the sharding plan, printed (multi-rank)
  std::string placement_text_;  // the launcher and one line per node, for the log
  std::unique_ptr<runtime::optim::Optimizer> optimizer_;
  std::unique_ptr<runtime::optim::LRScheduler> scheduler_;
  std::unique_ptr<parallel::ShardedManagedCollisionCollection>
      mc_;  // [embedding] managed_collision
  std::unique_ptr<TrainCheckpointer> checkpointer_;
  // [embedding] prefetch: the next batch, read one step ahead, and the loader state before it.
  std::optional<data::recsys::RecsysBatch> lookahead_;
  std::map<std::string, int64_t> state_before_lookahead_;
  runtime::sparse::KvStats kv_logged_;  // at the last log line
  // Moves what the stream's connection thread logged (stream_log_) into `out`, on this thread.
  void forward_stream_log(std::ostream& out) const;
  // Rank 0's stream warnings, written by the stream's thread, forwarded to log() by the training
  // thread (which alone writes log()). Declared before stream_, which logs into it until it is
  // destroyed.
  std::unique_ptr<parallel::SharedLog> stream_log_;
  std::unique_ptr<parallel::RowStreamClient> stream_;  // [embedding] stream_to
  mutable std::ostream null_log_{nullptr};
};

}  // namespace mt::train
