// TrainCheckpointer: what the trainer saves and restores, on top of checkpoint::CheckpointManager.
//
// Tensors (names in the checkpoint):
//   model.<fqn>                         every parameter: its FSDP shard, placed in the whole tensor
//   optimizer.state.<fqn>.<name>        optimizer state (exp_avg, ...), sharded like its parameter
//   optimizer.state.<fqn>.step, optimizer.param_groups.<g>.<hyper>, lr_scheduler.last_step
//                                       replicated scalars (written once)
//   <extension pieces>                  state the model keeps outside its FSDP parameters (sharded
//                                       embedding tables and their row optimizers), placed by the
//                                       CheckpointExtension in global coordinates
// Values (/state in the index): step, tokens_seen (samples for recsys models), seed, config (the
// resolved TOML), architecture (the model's, see train/model_spec.h), global_batch_size, and
// dataloader/rank_<r>/<key> for every data-parallel rank (the data state).
//
// Resuming ([checkpoint] enable): the checkpoint at load_step (-1 = the latest complete one) in
// <dump_folder>/<folder> is loaded in full; with no checkpoint there, initial_load_path (a
// step-N folder) gives the model weights only (any float dtype is converted); else the run starts
// fresh. exclude_from_loading lists name prefixes not loaded (e.g. "optimizer."; "dataloader":
// the loader starts from the beginning of the data). Else the data loader continues the token
// stream from the saved global position (the same for any world size).
// Saving: every `interval` steps and at the last step; model_only makes the last save hold only
// model.* tensors in export_dtype (for export). async_mode = "async" saves in the background.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "checkpoint/state.h"
#include "train/config/job_config.h"

namespace mt::checkpoint {
class CheckpointManager;
struct CheckpointState;
struct Index;
}  // namespace mt::checkpoint
namespace mt::parallel {
class ProcessGroup;
}
namespace mt::runtime::nn {
class Module;
}
namespace mt::runtime::optim {
class Optimizer;
class LRScheduler;
}  // namespace mt::runtime::optim

namespace mt::train {

// The data pipeline's resumable state: integers by key, global (the same on every rank, for any
// world size), e.g. data::LoaderState::to_map().
struct CheckpointedData {
  std::function<std::map<std::string, int64_t>()> state;
  std::function<void(const std::map<std::string, int64_t>&)> load_state;
};

// The model's persistent buffers, saved whole as model.<fqn> beside its parameters: state_dict()
// minus the parameters (e.g. the MoE routing bias). The same on every rank.
std::vector<std::pair<std::string, runtime::Tensor>> persistent_buffers(runtime::nn::Module& model);

// What a model keeps outside its FSDP parameters (e.g. sharded embedding tables, whose shards are
// plain parameters of the module but sit at row/column offsets of the global table): the
// checkpointer leaves the parameters it owns out of the model pieces and lets it add its own.
//   add_pieces        saving: this rank's pieces (names under "model." for weights; model_only:
//                     nothing else), in global coordinates
//   add_load_pieces   loading: the pieces of this rank's layout to read from the checkpoint whose
//                     index is `saved` (model_only: weights only; none whose name starts with an
//                     `exclude` prefix)
//   apply_loaded      loading: the filled pieces back into the model (called after
//                     add_load_pieces, on every rank)
struct CheckpointExtension {
  std::function<bool(const std::string& param_fqn)> owns_parameter;
  std::function<void(checkpoint::CheckpointState& state, bool model_only)> add_pieces;
  std::function<void(const checkpoint::Index& saved, checkpoint::CheckpointState& dest,
                     bool model_only, const std::vector<std::string>& exclude)>
      add_load_pieces;
  std::function<void(const checkpoint::CheckpointState& loaded)> apply_loaded;
};

struct ResumePoint {
  int64_t step = 0;  // steps already done (0 = fresh)
  int64_t tokens_seen = 0;
  std::string source;  // the folder loaded, "" when none
};

// The checkpoint a job starts from: with [checkpoint] enable, load_step's (or the latest
// complete one) in <dump_folder>/<folder>; with none there, initial_load_path's (weights only);
// an empty dir: a fresh start. Errors name the key (a missing load_step, a bad initial path).
struct CheckpointToLoad {
  std::filesystem::path dir;
  bool weights_only = false;
};
CheckpointToLoad checkpoint_to_load(const config::JobConfig& config);

// With [checkpoint] enable, removes the saves that never finished (step-N.tmp) from the
// checkpoint folder, saying so in `log`: a failed save (full disk) must not keep the disk full
// for the next start. Rank 0 calls it before the run writes anything.
void remove_incomplete_saves(const config::JobConfig& config, std::ostream& log);

class TrainCheckpointer {
 public:
  TrainCheckpointer(const config::JobConfig& config, std::shared_ptr<parallel::ProcessGroup> world,
                    runtime::nn::Module& model, runtime::optim::Optimizer& optimizer,
                    runtime::optim::LRScheduler& scheduler, CheckpointedData data,
                    CheckpointExtension extension = {});
  ~TrainCheckpointer();

  // Collective. Loads what the config asks for (see above).
  ResumePoint resume(std::ostream& log);
  // Collective. Saves after `step` when it is due (every interval), at the run's last step, and
  // when the run stops early (`stopping`: a full checkpoint, never model-only).
  void after_step(int64_t step, int64_t tokens_seen, bool last, bool stopping, std::ostream& log);
  void finish();  // waits for a background save
  // The model's architecture (ModelSpec::architecture), kept in every save as
  // /state/architecture so that tools and later runs build the same model.
  void save_architecture(std::string text) { architecture_ = std::move(text); }
  // The run's global batch (sequences or samples per optimizer step, all ranks), kept in every
  // save as /state/global_batch_size. Resuming a checkpoint whose batch differs is an error
  // unless [training] allow_batch_change (then a warning): e.g. global_batch_size = -1 on
  // another rank count. `how` says how it is made up, for the message.
  void set_global_batch(int64_t size, std::string how) {
    global_batch_ = size;
    global_batch_how_ = std::move(how);
  }

 private:
  checkpoint::CheckpointState state(int64_t step, int64_t tokens_seen, bool model_only) const;
  checkpoint::CheckpointState load_template(bool model_only) const;  // model + optimizer pieces
  bool owned_by_extension(const std::string& param_fqn) const;
  // Refuses (or, allowed, warns about) a saved global batch other than this run's.
  void check_global_batch(const checkpoint::Values& saved, const std::filesystem::path& dir,
                          std::ostream& log) const;

  const config::JobConfig& config_;
  std::shared_ptr<parallel::ProcessGroup> world_;
  runtime::nn::Module& model_;
  runtime::optim::Optimizer& optimizer_;
  runtime::optim::LRScheduler& scheduler_;
  CheckpointedData data_;
  CheckpointExtension extension_;
  std::unique_ptr<checkpoint::CheckpointManager> manager_;
  int64_t global_batch_ = 0;  // 0: not set (not saved, not checked)
  std::string global_batch_how_;
  std::string architecture_;
};

}  // namespace mt::train
