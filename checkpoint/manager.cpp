// CheckpointManager (see manager.h).
#include "checkpoint/manager.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <system_error>

#include "checkpoint/index.h"
#include "parallel/comm/process_group.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"

namespace mt::checkpoint {

namespace fs = std::filesystem;

namespace {

// "step-123" -> 123; nullopt for anything else (step-12.tmp, notes, ...).
std::optional<int64_t> step_of(const std::string& name) {
  if (!name.starts_with("step-") || name.size() == 5) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10) return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// A snapshot the background writer owns. Device tensors are copied to the host here, on the
// training thread: the writer thread then never touches a GPU (it has no current device of its
// own), and the snapshot costs host memory rather than GPU memory while training goes on.
CheckpointState staged_copy(const CheckpointState& state) {
  CheckpointState copy = state;
  for (TensorPiece& p : copy.tensors) {
    if (p.streamed()) continue;  // produced by the writer from its own consistent view
    p.local = p.local.device().is_cpu() ? p.local.contiguous().clone()
                                        : p.local.to(runtime::Device::cpu());
  }
  return copy;
}

// The same snapshot, copied into `buffers` (one per tensor, kept from the previous save where
// its shape and dtype still fit; new ones page-locked for tensors on a GPU).
CheckpointState staged_into(const CheckpointState& state, std::vector<runtime::Tensor>& buffers) {
  CheckpointState copy = state;
  buffers.resize(copy.tensors.size());
  for (size_t i = 0; i < copy.tensors.size(); ++i) {
    if (copy.tensors[i].streamed()) continue;
    runtime::Tensor& buffer = buffers[i];
    const runtime::Tensor& src = copy.tensors[i].local;
    if (!buffer.defined() || buffer.shape() != src.shape() || buffer.dtype() != src.dtype()) {
      buffer = src.device().is_cpu()
                   ? runtime::Tensor::empty(src.shape(), runtime::TensorOptions{}.with_dtype(
                                                             src.dtype()))
                   : runtime::Tensor::empty_pinned(src.shape(), src.dtype());
    }
    if (src.device().is_cpu()) {
      buffer.copy_(src);
    } else {  // straight into the page-locked buffer (copy_ would stage it in pageable memory)
      runtime::device_runtime(src.device().type)
          ->copy_between_devices(src.contiguous(), buffer, /*non_blocking=*/false);
    }
    copy.tensors[i].local = buffer;
  }
  return copy;
}

}  // namespace

std::vector<fs::path> remove_incomplete_saves(const fs::path& folder) {
  std::vector<fs::path> removed;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return removed;
  for (const fs::directory_entry& e : fs::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.ends_with(".tmp") || !step_of(name.substr(0, name.size() - 4))) continue;
    fs::remove_all(e.path(), ec);
    MT_CHECK(!ec, "checkpoint: cannot remove the incomplete save ", e.path().string(), ": ",
             ec.message());
    removed.push_back(e.path());
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::vector<int64_t> complete_checkpoint_steps(const fs::path& folder) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return steps;
  for (const fs::directory_entry& e : fs::directory_iterator(folder, ec)) {
    const auto step = step_of(e.path().filename().string());
    if (step && fs::exists(e.path() / kIndexFileName, ec)) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::vector<fs::path> steps_without_index(const fs::path& folder) {
  std::vector<fs::path> damaged;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return damaged;
  for (const fs::directory_entry& e : fs::directory_iterator(folder, ec)) {
    if (step_of(e.path().filename().string()) && fs::is_directory(e.path(), ec) &&
        !fs::exists(e.path() / kIndexFileName, ec)) {
      damaged.push_back(e.path());
    }
  }
  std::sort(damaged.begin(), damaged.end());
  return damaged;
}

fs::path resolve_checkpoint_dir(const fs::path& path, const std::string& what) {
  if (fs::exists(path / kIndexFileName)) return path;
  MT_CHECK(fs::exists(path), what, ": ", path.string(), " does not exist");
  const std::vector<int64_t> steps = complete_checkpoint_steps(path);
  MT_CHECK(!steps.empty(), what, ": ", path.string(), " is neither a checkpoint (no ",
           kIndexFileName, ") nor a folder of complete step-N checkpoints");
  return path / ("step-" + std::to_string(steps.back()));
}

CheckpointManager::CheckpointManager(ManagerOptions options,
                                     std::shared_ptr<parallel::ProcessGroup> group)
    : options_(std::move(options)), group_(std::move(group)) {
  MT_CHECK(!options_.folder.empty(), "checkpoint: the checkpoint folder is empty");
  MT_CHECK(options_.async || !options_.reuse_staging,
           "checkpoint: reuse_staging needs async saves (it keeps their staging buffers)");
  save_group_ = options_.async ? std::shared_ptr<parallel::ProcessGroup>(group_->split(0, group_->rank()))
                               : group_;
  if (group_->rank() == 0) fs::create_directories(options_.folder);
}

CheckpointManager::~CheckpointManager() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::cerr << "checkpoint: the background save failed: " << e.what() << "\n";
  }
}

fs::path CheckpointManager::step_folder(int64_t step) const {
  return options_.folder / ("step-" + std::to_string(step));
}

std::vector<int64_t> CheckpointManager::complete_steps() const {
  return complete_checkpoint_steps(options_.folder);
}

std::optional<int64_t> CheckpointManager::latest_step() const {
  const std::vector<int64_t> steps = complete_steps();
  if (steps.empty()) return std::nullopt;
  return steps.back();
}

bool CheckpointManager::save_in_flight() const {
  return in_flight_.valid() &&
         in_flight_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

void CheckpointManager::wait() {
  if (in_flight_.valid()) in_flight_.get();
}

void CheckpointManager::save(int64_t step, const CheckpointState& state) {
  wait();
  const fs::path dir = step_folder(step);
  if (!options_.async) {
    save_checkpoint(dir, state, *group_);
    remove_old_checkpoints();
    return;
  }
  // The previous save has finished (wait() above), so its buffers are free to take this one.
  auto staged = std::make_shared<CheckpointState>(
      options_.reuse_staging ? staged_into(state, staging_) : staged_copy(state));
  in_flight_ = std::async(std::launch::async, [this, dir, staged] {
    save_checkpoint(dir, *staged, *save_group_);
    remove_old_checkpoints();
  });
}

void CheckpointManager::remove_old_checkpoints() {
  if (options_.keep_latest_k <= 0 || group_->rank() != 0) return;
  const std::vector<int64_t> steps = complete_steps();
  const size_t keep = size_t(options_.keep_latest_k);
  for (size_t i = 0; i + keep < steps.size(); ++i) {
    // Renamed first (atomically), so a crash mid-removal never leaves a step-N folder that looks
    // complete but lacks rank files.
    const fs::path doomed = fs::path(step_folder(steps[i]).string() + ".removing");
    std::error_code ec;
    fs::rename(step_folder(steps[i]), doomed, ec);
    if (!ec) fs::remove_all(doomed, ec);
    if (ec) {
      std::cerr << "checkpoint: could not remove " << step_folder(steps[i]).string() << ": "
                << ec.message() << "\n";
    }
  }
}

LoadReport CheckpointManager::load(int64_t step, CheckpointState& dest,
                                   const LoadOptions& options) {
  wait();
  return load_checkpoint(step_folder(step), dest, *group_, options);
}

}  // namespace mt::checkpoint
