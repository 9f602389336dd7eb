// fully_shard: the per-module FSDP state, its forward/backward hooks, and the root's end-of-
// backward work.
#include "parallel/fsdp/fully_shard.h"

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>

#include "runtime/autograd/engine.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/nn/linear.h"
#include "runtime/ops/factory.h"

namespace mt::parallel {

using runtime::nn::Module;

class FSDPState {
 public:
  FSDPState(Module& module, std::unique_ptr<FSDPParamGroup> group, FullyShardOptions options)
      : module_(&module), group_(std::move(group)), options_(options) {}

  Module& module() const { return *module_; }
  FSDPParamGroup* group() const { return group_.get(); }
  FullyShardOptions& options() { return options_; }

  void pre_forward();
  void post_forward();
  void pre_backward();
  void post_backward();

 private:
  // Bookkeeping of the outermost fully_shard module of a forward pass.
  struct Root {
    std::vector<FSDPState*> order;           // this forward pass, in call order
    std::vector<FSDPState*> previous_order;  // the previous pass (forward prefetch)
    uint64_t finalize_pass = 0;  // the backward pass whose end-of-backward work is queued
    FSDPParamGroup* pending_reduce = nullptr;
  };
  // The end of backward pass `pass`: the post-backward work of the modules it ran that their
  // own hooks did not do, the last reduce-scatter waited for, everything resharded.
  void finalize_backward(uint64_t pass);
  // Frees the gathered parameters, unless a backward pass still owes this module its
  // post-backward: a split backward's weight pass may read them (ops' saved tensors), so they
  // stay gathered until its last pass ends.
  void reshard();
  void reshard_all();
  static void prefetch(FSDPState* next);

  Module* module_;
  std::unique_ptr<FSDPParamGroup> group_;
  FullyShardOptions options_;
  std::unique_ptr<Root> root_data_;  // set while this state is (or was) a root
  FSDPState* root_ = nullptr;        // the root of the pass this module last ran in
  // The backward passes that ran this module's pre-backward and still owe its post-backward, in
  // order: one at a time, except under a split backward (zero-bubble pipelines), where other
  // micro-batches' input passes run before a weight pass ends (autograd::backward_input).
  std::deque<uint64_t> pending_passes_;
};

namespace {

bool is_float8_linear_weight(const runtime::nn::NamedSlot& slot) {
  const auto* linear = dynamic_cast<const runtime::nn::Linear*>(slot.owner);
  return linear != nullptr && linear->float8 && slot.local_name == "weight";
}

thread_local FSDPState* t_forward_root = nullptr;

// Every live FSDP state, to find the shards of a module tree.
std::mutex g_registry_mutex;
std::vector<std::weak_ptr<FSDPState>> g_registry;

std::vector<std::shared_ptr<FSDPState>> live_states() {
  std::lock_guard lock(g_registry_mutex);
  std::vector<std::shared_ptr<FSDPState>> out;
  std::erase_if(g_registry, [](const auto& w) { return w.expired(); });
  for (const auto& w : g_registry) {
    if (auto s = w.lock()) out.push_back(std::move(s));
  }
  return out;
}

// The FSDPParam whose sharded leaf `t` is, if any.
const FSDPParam* find_fsdp_param(const std::vector<std::shared_ptr<FSDPState>>& states,
                                 const Tensor& t) {
  for (const auto& s : states) {
    if (s->group() == nullptr) continue;
    for (const auto& p : s->group()->params()) {
      if (p->sharded().same(t) || p->unsharded().same(t)) return p.get();
    }
  }
  return nullptr;
}

}  // namespace

void FSDPState::prefetch(FSDPState* next) {
  if (next != nullptr && next->group_ != nullptr &&
      next->group_->state() == FSDPParamGroup::State::Sharded) {
    next->group_->unshard(/*async=*/true);
  }
}

void FSDPState::pre_forward() {
  if (t_forward_root == nullptr) {
    t_forward_root = this;
    if (!root_data_) root_data_ = std::make_unique<Root>();
    // Anything left unsharded by a pass without backward is stale once shards change.
    reshard_all();
    root_data_->previous_order = std::move(root_data_->order);
    root_data_->order.clear();
  }
  root_ = t_forward_root;
  Root& root = *root_->root_data_;
  root.order.push_back(this);
  if (group_) {
    group_->unshard(/*async=*/false);
    group_->wait_for_unshard();
    group_->use_unsharded_params();
  }
  if (options_.prefetch) {
    const auto& prev = root.previous_order;
    const size_t i = root.order.size() - 1;
    if (i + 1 < prev.size() && prev[i] == this) prefetch(prev[i + 1]);
  }
}

void FSDPState::post_forward() {
  const bool grad = runtime::GradMode::enabled();
  if (group_) {
    group_->use_sharded_params();
    if (!grad || options_.reshard_after_forward) reshard();
  }
  if (t_forward_root == this) {
    t_forward_root = nullptr;
    if (!grad) reshard_all();  // no backward will come: nothing stays gathered
  }
}

void FSDPState::pre_backward() {
  if (root_ == nullptr) return;  // not run forward under fully_shard hooks
  Root& root = *root_->root_data_;
  const uint64_t pass = runtime::autograd::current_backward_pass();
  if (root.finalize_pass != pass) {
    root.finalize_pass = pass;
    runtime::autograd::queue_callback(
        [root_state = root_, pass] { root_state->finalize_backward(pass); });
  }
  if (group_) {
    group_->unshard(/*async=*/false);
    group_->wait_for_unshard();
    group_->use_unsharded_params();  // activation checkpointing recomputes with them
  }
  if (pending_passes_.empty() || pending_passes_.back() != pass) pending_passes_.push_back(pass);
  if (options_.prefetch) {
    const auto& order = root.order;
    auto it = std::find(order.begin(), order.end(), this);
    if (it != order.end() && it != order.begin()) prefetch(*(it - 1));
  }
}

void FSDPState::post_backward() {
  // The oldest pass owing it: a split backward's weight passes end in their input passes' order.
  if (pending_passes_.empty()) return;
  pending_passes_.pop_front();
  if (!group_) return;
  group_->use_sharded_params();
  Root& root = *root_->root_data_;
  if (root.pending_reduce != nullptr && root.pending_reduce != group_.get()) {
    root.pending_reduce->wait_for_reduce_scatter();
    root.pending_reduce = nullptr;
  }
  if (group_->start_reduce_scatter()) root.pending_reduce = group_.get();
  reshard();
}

void FSDPState::reshard() {
  if (group_ && pending_passes_.empty()) group_->reshard();
}

void FSDPState::finalize_backward(uint64_t pass) {
  Root& root = *root_data_;
  for (auto it = root.order.rbegin(); it != root.order.rend(); ++it) {
    const std::deque<uint64_t>& pending = (*it)->pending_passes_;
    if (!pending.empty() && pending.front() == pass) (*it)->post_backward();
  }
  if (root.pending_reduce != nullptr) root.pending_reduce->wait_for_reduce_scatter();
  root.pending_reduce = nullptr;
  reshard_all();
}

void FSDPState::reshard_all() {
  if (!root_data_) return;
  for (auto* list : {&root_data_->order, &root_data_->previous_order}) {
    for (FSDPState* s : *list) {
      if (!s->group_) continue;
      s->reshard();
      s->group_->use_sharded_params();
    }
  }
}

// ---- public API ----------------------------------------------------------------------------

Module& FSDPModule::module() const { return state_->module(); }
FSDPParamGroup* FSDPModule::group() const { return state_->group(); }
void FSDPModule::set_reshard_after_forward(bool on) { state_->options().reshard_after_forward = on; }

void FSDPModule::unshard() {
  if (auto* g = state_->group()) {
    g->unshard(/*async=*/false);
    g->wait_for_unshard();
  }
}

void FSDPModule::reshard() {
  if (auto* g = state_->group()) g->reshard();
}

std::shared_ptr<FSDPModule> fully_shard(Module& module, std::shared_ptr<DeviceMesh> mesh,
                                        FullyShardOptions options) {
  MT_CHECK(mesh != nullptr, "fully_shard(", module.type_name(), "): the mesh is null");
  MT_CHECK(mesh->ndim() == 1 || mesh->ndim() == 2, "fully_shard(", module.type_name(),
           "): expected a 1-D (shard) or 2-D (replicate, shard) mesh, got ", mesh->describe());
  const auto states = live_states();
  for (const auto& s : states) {
    MT_CHECK(&s->module() != &module, "fully_shard(", module.type_name(),
             "): this module is already sharded");
  }
  if (options.gradient_divide_factor == 0) options.gradient_divide_factor = double(mesh->size());

  std::vector<std::unique_ptr<FSDPParam>> params;
  const auto slots = module.named_parameter_slots();
  // The slots' tensors before sharding: a tensor met again is tied to an earlier slot.
  std::vector<std::pair<Tensor, FSDPParam*>> originals;
  for (const auto& slot : slots) {
    const Tensor t = *slot.slot;
    auto tied = std::find_if(originals.begin(), originals.end(),
                             [&](const auto& o) { return o.first.same(t); });
    if (tied != originals.end()) {
      MT_CHECK(tied->second != nullptr, "fully_shard(", module.type_name(), "): parameter '",
               slot.fqn, "' is tied to a parameter of a submodule already sharded on its own; "
               "tie parameters within one fully_shard call (shard their common parent)");
      tied->second->add_tied_slot(slot.slot);
      continue;
    }
    if (find_fsdp_param(states, t) != nullptr) {  // a descendant's group owns it
      originals.emplace_back(t, nullptr);
      continue;
    }
    const runtime::DType compute = options.mp_policy.param_dtype.value_or(t.dtype());
    std::optional<OuterSharding> outer = options.outer_of ? options.outer_of(t) : std::nullopt;
    if (!outer) outer = options.outer;
    params.push_back(std::make_unique<FSDPParam>(slot.fqn, slot.slot, t, mesh, mesh->ndim() - 1,
                                                 compute, options.shard_dim,
                                                 outer ? &*outer : nullptr));
    params.back()->use_sharded();
    if (options.float8_all_gather && is_float8_linear_weight(slot) &&
        (!outer || options.float8_amax_group) && options.shard_dim == 0) {
      params.back()->enable_float8_all_gather();
    }
    originals.emplace_back(t, params.back().get());
  }
  std::unique_ptr<FSDPParamGroup> group;
  if (!params.empty()) {
    group = std::make_unique<FSDPParamGroup>(module.type_name(), std::move(params), mesh,
                                             options.mp_policy, options.gradient_divide_factor);
    group->set_float8_amax_group(options.float8_amax_group);
  }
  auto state = std::make_shared<FSDPState>(module, std::move(group), options);
  module.register_forward_pre_hook(
      [state](Module&, std::vector<Tensor>&) { state->pre_forward(); });
  module.register_forward_hook(
      [state](Module&, const std::vector<Tensor>&, std::vector<Tensor>&) { state->post_forward(); });
  module.register_backward_pre_hook([state](Module&) { state->pre_backward(); });
  module.register_backward_hook([state](Module&) { state->post_backward(); });
  {
    std::lock_guard lock(g_registry_mutex);
    g_registry.push_back(state);
  }
  // The sharded descendants' paths from here (the root comes last, so its paths stay).
  for (const auto& [path, m] : module.named_modules()) {
    if (path.empty()) continue;
    for (const auto& s : states)
      if (&s->module() == m && s->group() != nullptr) s->group()->set_module_path(path);
  }
  return std::shared_ptr<FSDPModule>(new FSDPModule(state));
}

std::vector<DistributedParam> distributed_parameters(Module& module) {
  const auto states = live_states();
  std::vector<DistributedParam> out;
  for (const auto& [fqn, t] : module.named_parameters()) {
    const FSDPParam* p = find_fsdp_param(states, t);
    out.push_back({fqn, t, p != nullptr ? &p->dtensor() : nullptr});
  }
  return out;
}

void init_sharded_parameters(Module& root, uint64_t seed) {
  // Every slot by FQN, tied ones too (a tied module's reset_parameters sees its own name).
  const auto states = live_states();
  std::map<std::string, const DTensor*> placed;
  for (const auto& slot : root.named_parameter_slots()) {
    const FSDPParam* p = find_fsdp_param(states, *slot.slot);
    MT_CHECK(p != nullptr, "init_sharded_parameters: parameter '", slot.fqn,
             "' is not sharded by fully_shard; a model built without initial values "
             "(nn::DeferredInitGuard) must be fully_shard'ed whole (the root too)");
    placed[slot.fqn] = &p->dtensor();
  }
  for (const auto& [prefix, module] : root.named_modules()) {
    const std::string dot = prefix.empty() ? "" : prefix + ".";
    runtime::nn::InitBlockScope blocks;
    for (const auto& [name, param] : module->named_parameters(/*recurse=*/false)) {
      const DTensor& d = *placed.at(dot + name);
      blocks.add(param, d.global_shape, d.local_offset);
    }
    module->reset_parameters(runtime::nn::InitContext{seed, dot});
  }
}

}  // namespace mt::parallel

namespace mt::parallel {
namespace {
// The FSDP groups of `root`'s tree that gather float8 codes.
std::vector<FSDPParamGroup*> float8_groups(Module& root) {
  std::vector<FSDPParamGroup*> groups;
  const auto modules = root.named_modules();
  for (const auto& s : live_states()) {
    const bool under = std::any_of(modules.begin(), modules.end(),
                                   [&](const auto& m) { return m.second == &s->module(); });
    if (under && s->group() != nullptr && s->group()->float8_gathered_count() > 0)
      groups.push_back(s->group());
  }
  return groups;
}
}  // namespace

void precompute_float8_scales(Module& root) {
  runtime::NoGradGuard no_grad;
  // Groups that reduce over the same ranks (shard group, and tp group) share one all-reduce.
  std::map<std::pair<ProcessGroup*, const ProcessGroup*>, std::vector<FSDPParamGroup*>> by_groups;
  for (FSDPParamGroup* g : float8_groups(root))
    by_groups[{&g->shard_group(), g->float8_amax_group()}].push_back(g);
  for (const auto& [key, groups] : by_groups) {
    ProcessGroup* pg = key.first;
    int64_t total = 0;
    for (FSDPParamGroup* g : groups) total += g->float8_gathered_count();
    const auto f32 = runtime::TensorOptions{}.with_dtype(runtime::DType::F32);
    const Tensor amaxes = runtime::empty({total}, f32.with_device(pg->device()));
    int64_t offset = 0;
    for (FSDPParamGroup* g : groups) {
      g->float8_shard_amaxes(amaxes.narrow(0, offset, g->float8_gathered_count()));
      offset += g->float8_gathered_count();
    }
    groups.front()->reduce_float8_amaxes(amaxes, "fsdp.float8_amax_precompute");
    offset = 0;
    for (FSDPParamGroup* g : groups) {
      g->set_float8_amaxes(amaxes.narrow(0, offset, g->float8_gathered_count()));
      offset += g->float8_gathered_count();
    }
  }
}

void clear_float8_scales(Module& root) {
  for (FSDPParamGroup* g : float8_groups(root)) g->set_float8_amaxes(Tensor());
}

}  // namespace mt::parallel
