// CheckpointManager: the checkpoints of one job, in one folder: step-N/ subfolders, which one is
// the latest, saving every so often (blocking or in the background), and keeping the newest k.
//
// - Complete checkpoints are the step-N folders holding an index.h5 (saves write step-N.tmp and
//   rename it, see distributed_checkpoint.h); step-N.tmp leftovers of crashed saves are ignored
//   and removed by the next save of that step.
// - Async mode: save() first copies every tensor into buffers the manager owns (so the training
//   steps that follow cannot change what is saved), then writes them on a background thread that
//   talks to the other ranks over its own process group (split from the job's at construction,
//   so its collectives never interleave with training's). At most one save is in flight: a new
//   save() first waits for the previous one; wait() rethrows a failed background save's error.
//   With reuse_staging (torchtitan's "async_with_pinned_mem"), the buffers are allocated once,
//   page-locked where the tensors are on a GPU (faster copies from it), and every later save
//   copies into them again: a save then blocks training only for the copies, not for allocating
//   and first touching a snapshot's worth of host memory, at the cost of holding that memory for
//   the manager's life.
// - keep_latest_k > 0: after a save completes, rank 0 removes the older complete checkpoints
//   beyond the newest k (never before the new one is complete).
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/distributed_checkpoint.h"

namespace mt::checkpoint {

struct ManagerOptions {
  std::filesystem::path folder;  // holds step-N/
  int64_t keep_latest_k = 0;     // <= 0: keep all
  bool async = false;
  bool reuse_staging = false;  // async only: keep the staging buffers for the next save
};

class CheckpointManager {
 public:
  // Collective over `group` (async mode splits a private group from it).
  CheckpointManager(ManagerOptions options, std::shared_ptr<parallel::ProcessGroup> group);
  ~CheckpointManager();  // waits for the save in flight (errors are reported, not thrown)
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Collective. Saves `state` as step-<step>; in async mode returns once the tensors are staged.
  void save(int64_t step, const CheckpointState& state);
  // Waits for the background save, if any; rethrows its error.
  void wait();
  bool save_in_flight() const;

  // Complete checkpoints, oldest first.
  std::vector<int64_t> complete_steps() const;
  std::optional<int64_t> latest_step() const;
  std::filesystem::path step_folder(int64_t step) const;

  LoadReport load(int64_t step, CheckpointState& dest, const LoadOptions& options = {});

 private:
  void remove_old_checkpoints();

  ManagerOptions options_;
  std::shared_ptr<parallel::ProcessGroup> group_;       // the job's ranks (foreground)
  std::shared_ptr<parallel::ProcessGroup> save_group_;  // the background saver's own group
  std::future<void> in_flight_;
  std::vector<runtime::Tensor> staging_;  // reuse_staging: the buffers, one per state tensor
};

// Removes the step-N.tmp folders in `folder` (saves that never finished: a crash, a kill, a full
// disk; readers ignore them) and returns them. For rank 0 at the start of a run.
std::vector<std::filesystem::path> remove_incomplete_saves(const std::filesystem::path& folder);

// Complete checkpoints (step-N folders with an index) in `folder`, oldest first.
std::vector<int64_t> complete_checkpoint_steps(const std::filesystem::path& folder);
// The step-N folders in `folder` without an index (damaged: a save renames its folder into place
// only after the index is written), which a resume skips.
std::vector<std::filesystem::path> steps_without_index(const std::filesystem::path& folder);

// `path` itself when it is a checkpoint (holds an index), else the latest complete step-N in it;
// errors name `what` (e.g. "[checkpoint] initial_load_path") and the path.
std::filesystem::path resolve_checkpoint_dir(const std::filesystem::path& path,
                                             const std::string& what);

}  // namespace mt::checkpoint
