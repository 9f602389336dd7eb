// TrainCheckpointer (see checkpointer.h).
#include "train/checkpointer.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "checkpoint/index.h"
#include "checkpoint/manager.h"
#include "parallel/fsdp/fully_shard.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/nn/module.h"
#include "runtime/ops/factory.h"
#include "runtime/optim/lr_scheduler.h"
#include "runtime/optim/optimizer.h"
#include "train/config/render.h"
#include "train/model_spec.h"

namespace mt::train {

namespace fs = std::filesystem;
using checkpoint::CheckpointState;
using checkpoint::TensorPiece;
using runtime::DType;
using runtime::Tensor;

namespace {

constexpr const char* kModel = "model.";
constexpr const char* kOptimizer = "optimizer.";
constexpr const char* kScheduler = "lr_scheduler.";
constexpr const char* kLoaderGroup = "dataloader";
constexpr const char* kGlobalBatchValue = "global_batch_size";

// Where each parameter's local tensor sits in the whole parameter, by FQN.
struct Placement {
  runtime::Shape global_shape;
  runtime::Shape offset;
};

std::map<std::string, Placement> placements_of(runtime::nn::Module& model) {
  std::map<std::string, Placement> out;
  for (const parallel::DistributedParam& p : parallel::distributed_parameters(model)) {
    if (p.dtensor) {
      out[p.fqn] = {p.dtensor->global_shape, p.dtensor->local_offset};
    } else {
      out[p.fqn] = {p.param.shape(), runtime::Shape(size_t(p.param.dim()), 0)};
    }
  }
  return out;
}

// The parameter FQN of an optimizer state key "state.<fqn>.<field>", or "" for other keys.
std::string param_of_state_key(const std::string& key, const runtime::optim::Optimizer& opt) {
  if (!key.starts_with("state.")) return "";
  std::vector<std::string> fields{"step"};
  fields.insert(fields.end(), opt.state_names().begin(), opt.state_names().end());
  for (const std::string& f : fields) {
    if (key.ends_with("." + f)) return key.substr(6, key.size() - 6 - f.size() - 1);
  }
  return "";
}

// A piece of `tensor` under `name`, placed like parameter `fqn` when it has the parameter's
// local shape (the optimizer's per-element state), else whole (replicated scalars).
TensorPiece placed(const std::string& name, const Tensor& tensor, const std::string& fqn,
                   const std::map<std::string, Placement>& placements) {
  auto it = placements.find(fqn);
  if (it == placements.end() || tensor.dim() == 0 ||
      tensor.dim() != int64_t(it->second.global_shape.size())) {
    return checkpoint::whole(name, tensor);
  }
  return {name, tensor, it->second.global_shape, it->second.offset};
}

fs::path checkpoint_folder(const config::JobConfig& c) {
  return fs::path(c.job.dump_folder) / c.checkpoint.folder;
}

DType export_dtype(const std::string& name) {
  if (name == "float32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  if (name == "float16") return DType::F16;
  MT_FAIL("[checkpoint] export_dtype: expected float32, bfloat16 or float16, got '", name, "'");
}

int64_t int_value(const checkpoint::Values& values, const std::string& key, const fs::path& dir) {
  auto it = values.find(key);
  MT_CHECK(it != values.end() && std::holds_alternative<int64_t>(it->second), "checkpoint ",
           dir.string(), ": no integer /state/", key);
  return std::get<int64_t>(it->second);
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> persistent_buffers(runtime::nn::Module& model) {
  std::set<std::string> params;  // every slot's name: a tied parameter is no buffer in its second
  for (const auto& slot : model.named_parameter_slots()) params.insert(slot.fqn);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [fqn, t] : model.state_dict()) {
    if (!params.contains(fqn)) out.emplace_back(fqn, t);
  }
  return out;
}

TrainCheckpointer::TrainCheckpointer(const config::JobConfig& config,
                                     std::shared_ptr<parallel::ProcessGroup> world,
                                     runtime::nn::Module& model,
                                     runtime::optim::Optimizer& optimizer,
                                     runtime::optim::LRScheduler& scheduler, CheckpointedData data,
                                     CheckpointExtension extension)
    : config_(config),
      world_(std::move(world)),
      model_(model),
      optimizer_(optimizer),
      scheduler_(scheduler),
      data_(std::move(data)),
      extension_(std::move(extension)) {
  const auto& c = config_.checkpoint;
  const bool pinned = c.async_mode == "async_with_pinned_mem";
  MT_CHECK(c.async_mode == "disabled" || c.async_mode == "async" || pinned,
           "[checkpoint] async_mode: expected \"disabled\", \"async\" or "
           "\"async_with_pinned_mem\", got \"",
           c.async_mode, "\"");
  export_dtype(c.export_dtype);  // validates
  MT_CHECK(!c.enable || c.interval > 0, "[checkpoint] interval must be > 0, got ", c.interval);
  if (c.enable) {
    manager_ = std::make_unique<checkpoint::CheckpointManager>(
        checkpoint::ManagerOptions{checkpoint_folder(config_), c.keep_latest_k,
                                   c.async_mode != "disabled", pinned},
        world_);
  }
}

TrainCheckpointer::~TrainCheckpointer() = default;

bool TrainCheckpointer::owned_by_extension(const std::string& fqn) const {
  return extension_.owns_parameter && extension_.owns_parameter(fqn);
}

CheckpointState TrainCheckpointer::state(int64_t step, int64_t tokens_seen, bool model_only) const {
  CheckpointState s;
  const auto placements = placements_of(model_);
  const DType stored = model_only ? export_dtype(config_.checkpoint.export_dtype) : DType::F32;
  for (const parallel::DistributedParam& p : parallel::distributed_parameters(model_)) {
    if (owned_by_extension(p.fqn)) continue;
    Tensor t = p.param.detach();
    if (model_only && runtime::is_floating(t.dtype())) t = t.to(stored);
    s.tensors.push_back(placed(kModel + p.fqn, t, p.fqn, placements));
  }
  for (const auto& [fqn, t] : persistent_buffers(model_)) {
    s.tensors.push_back(checkpoint::whole(kModel + fqn, t.detach()));
  }
  s.values["step"] = step;
  s.values["tokens_seen"] = tokens_seen;
  s.values["seed"] = config_.training.seed;
  s.values["config"] = config::render_toml(config_);
  s.values["model_only"] = int64_t(model_only ? 1 : 0);
  if (!architecture_.empty()) s.values[kArchitectureValue] = architecture_;
  if (global_batch_ > 0) s.values[kGlobalBatchValue] = global_batch_;
  if (extension_.add_pieces) extension_.add_pieces(s, model_only);
  if (model_only) return s;
  for (const auto& [key, t] : optimizer_.state_dict()) {
    s.tensors.push_back(
        placed(kOptimizer + key, t, param_of_state_key(key, optimizer_), placements));
  }
  for (const auto& [key, t] : scheduler_.state_dict()) {
    s.tensors.push_back(checkpoint::whole(kScheduler + key, t));
  }
  s.per_rank_group = kLoaderGroup;
  for (const auto& [key, v] : data_.state()) s.per_rank_values[key] = v;
  return s;
}

CheckpointState TrainCheckpointer::load_template(bool model_only) const {
  CheckpointState s;
  const auto placements = placements_of(model_);
  for (const parallel::DistributedParam& p : parallel::distributed_parameters(model_)) {
    if (owned_by_extension(p.fqn)) continue;
    s.tensors.push_back(placed(kModel + p.fqn, p.param.detach(), p.fqn, placements));
  }
  for (const auto& [fqn, t] : persistent_buffers(model_)) {
    s.tensors.push_back(checkpoint::whole(kModel + fqn, t.detach()));
  }
  s.per_rank_group = kLoaderGroup;
  if (model_only) return s;
  // Optimizer state for every parameter (a fresh optimizer has none yet), hyper-parameters.
  const auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const Tensor& param = groups[g].params[i];
      const std::string key = "state." + optimizer_.param_key(g, i);
      const std::string fqn = key.substr(6);
      s.tensors.push_back(
          checkpoint::whole(kOptimizer + key + ".step", runtime::zeros({}, {DType::I64})));
      for (const std::string& name : optimizer_.state_names()) {
        Tensor buf =
            runtime::zeros(param.shape(), {runtime::optim::state_dtype_for(param.dtype())});
        s.tensors.push_back(placed(kOptimizer + key + "." + name, buf, fqn, placements));
      }
    }
  }
  for (const auto& [key, t] : optimizer_.state_dict()) {
    if (key.starts_with("param_groups.")) {
      s.tensors.push_back(checkpoint::whole(kOptimizer + key, t.clone()));
    }
  }
  for (const auto& [key, t] : scheduler_.state_dict()) {
    s.tensors.push_back(checkpoint::whole(kScheduler + key, t.clone()));
  }
  return s;
}

CheckpointToLoad checkpoint_to_load(const config::JobConfig& config) {
  const auto& c = config.checkpoint;
  if (c.enable) {
    const fs::path folder = checkpoint_folder(config);
    const std::vector<int64_t> steps = checkpoint::complete_checkpoint_steps(folder);
    fs::path dir;
    if (c.load_step >= 0) {
      MT_CHECK(std::find(steps.begin(), steps.end(), c.load_step) != steps.end(),
               "[checkpoint] load_step = ", c.load_step, ": no complete checkpoint step-",
               c.load_step, " in ", folder.string());
      dir = folder / ("step-" + std::to_string(c.load_step));
    } else if (!steps.empty()) {
      dir = folder / ("step-" + std::to_string(steps.back()));
    }
    if (!dir.empty()) {
      const checkpoint::Index index = checkpoint::read_index(dir / checkpoint::kIndexFileName);
      return {dir, int_value(index.values, "model_only", dir) == 1};
    }
  }
  if (c.initial_load_path.empty()) return {};
  return {checkpoint::resolve_checkpoint_dir(c.initial_load_path, "[checkpoint] initial_load_path"),
          true};
}

void remove_incomplete_saves(const config::JobConfig& config, std::ostream& log) {
  if (!config.checkpoint.enable) return;
  for (const fs::path& p : checkpoint::remove_incomplete_saves(checkpoint_folder(config))) {
    log << "checkpoint: removed " << p.string() << ", a save that did not finish\n";
  }
  for (const fs::path& p : checkpoint::steps_without_index(checkpoint_folder(config))) {
    log << "checkpoint: skipping " << p.string() << ": it has no " << checkpoint::kIndexFileName
        << " (damaged), so the run cannot resume from it\n";
  }
}

ResumePoint TrainCheckpointer::resume(std::ostream& log) {
  const auto& c = config_.checkpoint;
  ResumePoint point;
  const auto [dir, weights_only] = checkpoint_to_load(config_);
  if (dir.empty()) return point;

  const checkpoint::Index saved = checkpoint::read_index(dir / checkpoint::kIndexFileName);
  if (!weights_only) check_global_batch(saved.values, dir, log);
  CheckpointState dest = load_template(weights_only);
  checkpoint::LoadOptions options;
  options.exclude = c.exclude_from_loading;
  if (weights_only) {
    options.exclude.insert(options.exclude.end(), {kOptimizer, kScheduler});
    options.convert_dtypes = true;
  }
  if (extension_.add_load_pieces) {
    extension_.add_load_pieces(saved, dest, weights_only, options.exclude);
  }
  checkpoint::LoadReport report;
  {
    runtime::NoGradGuard no_grad;
    report = checkpoint::load_checkpoint(dir, dest, *world_, options);
  }
  point.source = dir.string();
  if (extension_.apply_loaded) extension_.apply_loaded(dest);
  if (weights_only) {
    log << "checkpoint: loaded the model weights of " << dir.string()
        << " (optimizer, schedule and data start fresh)\n";
    return point;
  }
  // Optimizer and scheduler from their pieces (excluded ones keep their fresh state); the data
  // loader from the saved global position.
  runtime::nn::StateDict opt_state, sched_state;
  for (const TensorPiece& p : dest.tensors) {
    if (checkpoint::is_excluded(p.fqn, options.exclude)) continue;
    if (p.fqn.starts_with(kOptimizer)) opt_state.insert(p.fqn.substr(10), p.local);
    if (p.fqn.starts_with(kScheduler)) sched_state.insert(p.fqn.substr(13), p.local);
  }
  if (!opt_state.empty()) optimizer_.load_state_dict(opt_state);
  if (!sched_state.empty()) scheduler_.load_state_dict(sched_state);
  point.step = int_value(report.values, "step", dir);
  point.tokens_seen = int_value(report.values, "tokens_seen", dir);
  if (checkpoint::is_excluded(kLoaderGroup, options.exclude)) {
    log << "checkpoint: resumed from " << dir.string() << " at step " << point.step
        << "; the data loader starts from the beginning of the data (\"dataloader\" in "
           "checkpoint.exclude_from_loading)\n";
    return point;
  }
  MT_CHECK(!report.per_rank_values.empty(), "checkpoint ", dir.string(),
           ": no data loader state (/state/dataloader)");
  std::map<std::string, int64_t> loader_state;
  for (const auto& [key, v] : report.per_rank_values[0]) {
    MT_CHECK(std::holds_alternative<int64_t>(v), "checkpoint ", dir.string(),
             ": data loader value ", key, " is not an integer");
    loader_state[key] = std::get<int64_t>(v);
  }
  try {
    data_.load_state(loader_state);
  } catch (const Error& e) {  // the loader's words, with where they came from and what to change
    MT_FAIL("checkpoint ", dir.string(), ": ", e.what(),
            "; resume with the checkpoint's training.seq_len, training.seed, dataset and "
            "validation.enable, or start a new run in another job.dump_folder");
  }
  log << "checkpoint: resumed from " << dir.string() << " at step " << point.step << "\n";
  return point;
}

void TrainCheckpointer::check_global_batch(const checkpoint::Values& saved, const fs::path& dir,
                                           std::ostream& log) const {
  const auto it = saved.find(kGlobalBatchValue);
  // Checkpoints written before the value was kept cannot be checked.
  if (global_batch_ == 0 || it == saved.end() || !std::holds_alternative<int64_t>(it->second))
    return;
  const int64_t before = std::get<int64_t>(it->second);
  if (before == global_batch_) return;
  std::ostringstream what;
  what << "the checkpoint " << dir.string() << " was trained with a global batch of " << before
       << " per optimizer step, but this run's is " << global_batch_ << " (" << global_batch_how_
       << ")";
  MT_CHECK(config_.training.allow_batch_change, "train: ", what.str(),
           ". Resuming with another batch changes the optimization (the learning rate was set "
           "for a batch of ",
           before, ") and which data each step sees. Set training.global_batch_size = ", before,
           " if it divides on this rank count, resume on the checkpoint's rank count, or set "
           "training.allow_batch_change = true to go on with ",
           global_batch_);
  log << "warning: " << what.str() << "; going on (training.allow_batch_change = true)\n";
}

void TrainCheckpointer::after_step(int64_t step, int64_t tokens_seen, bool last, bool stopping,
                                   std::ostream& log) {
  if (!manager_) return;
  const auto& c = config_.checkpoint;
  if (step % c.interval != 0 && !last && !stopping) return;
  const bool model_only = last && !stopping && c.model_only;
  manager_->save(step, state(step, tokens_seen, model_only));
  log << "checkpoint: " << (manager_->save_in_flight() ? "saving " : "saved ")
      << manager_->step_folder(step).string()
      << (model_only ? " (model only, " + c.export_dtype + ")" : "") << "\n";
}

void TrainCheckpointer::finish() {
  if (manager_) manager_->wait();
}

}  // namespace mt::train
