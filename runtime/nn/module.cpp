#include "runtime/nn/module.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "runtime/autograd/checkpoint.h"
#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/core/grad_mode.h"

namespace mt::runtime::nn {

// Per forward call: which backward hooks already fired.
struct Module::BackwardState {
  bool pre_fired = false;
  bool post_fired = false;
  bool post_via_node = false;  // the identity node on the inputs fires the post hooks
};

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}
Module::~Module() = default;

// ---- registration --------------------------------------------------------------------------

void Module::check_new_name(const std::string& name, const char* what) const {
  MT_CHECK(!name.empty(), type_name_, ": ", what, " name must not be empty");
  MT_CHECK(name.find('.') == std::string::npos, type_name_, ": ", what, " name '", name,
           "' must not contain '.'");
  auto taken = [&](const std::vector<TensorEntry>& v) {
    return std::any_of(v.begin(), v.end(), [&](const TensorEntry& e) { return e.name == name; });
  };
  const bool child = std::any_of(children_.begin(), children_.end(),
                                 [&](const auto& c) { return c.first == name; });
  MT_CHECK(!taken(params_) && !taken(buffers_) && !child, type_name_, ": cannot register ", what,
           " '", name, "': the name is already taken");
}

Tensor& Module::register_parameter(const std::string& name, Tensor& member, bool requires_grad) {
  check_new_name(name, "parameter");
  MT_CHECK(member.defined(), type_name_, ": parameter '", name, "' is undefined");
  MT_CHECK(member.is_leaf(), type_name_, ": parameter '", name,
           "' must be a leaf tensor (detach() it first)");
  MT_CHECK(!requires_grad || member.is_floating_point(), type_name_, ": parameter '", name,
           "' requires grad but has dtype ", member.dtype());
  member.set_requires_grad(requires_grad);
  if (DeferredInitGuard::active()) member.storage()->release_memory();
  params_.push_back({name, &member, true});
  return member;
}

Tensor& Module::register_buffer(const std::string& name, Tensor& member, bool persistent) {
  check_new_name(name, "buffer");
  MT_CHECK(member.defined(), type_name_, ": buffer '", name, "' is undefined");
  buffers_.push_back({name, &member, persistent});
  return member;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "submodule");
  MT_CHECK(module != nullptr, type_name_, ": submodule '", name, "' is null");
  MT_CHECK(module.get() != this, type_name_, ": a module cannot be its own child");
  children_.emplace_back(name, std::move(module));
}

std::shared_ptr<Module> Module::replace_module(const std::string& name,
                                               std::shared_ptr<Module> module) {
  MT_CHECK(module != nullptr, type_name_, ": replacement for submodule '", name, "' is null");
  MT_CHECK(module.get() != this, type_name_, ": a module cannot be its own child");
  for (auto& [child_name, child] : children_) {
    if (child_name == name) {
      std::swap(child, module);
      return module;
    }
  }
  MT_FAIL(type_name_, ": cannot replace submodule '", name, "': there is no such child");
}

// ---- traversal -----------------------------------------------------------------------------

void Module::collect_slots(const std::string& prefix, bool buffers, bool persistent_only,
                           std::vector<NamedSlot>& out) {
  for (const TensorEntry& e : buffers ? buffers_ : params_) {
    if (persistent_only && !e.persistent) continue;
    out.push_back({prefix + e.name, e.slot, this, e.name});
  }
  for (auto& [name, child] : children_)
    child->collect_slots(prefix + name + ".", buffers, persistent_only, out);
}

std::vector<NamedSlot> Module::named_parameter_slots() {
  std::vector<NamedSlot> out;
  collect_slots("", false, false, out);
  return out;
}

std::vector<NamedSlot> Module::named_buffer_slots() {
  std::vector<NamedSlot> out;
  collect_slots("", true, false, out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (!recurse) {
    for (const TensorEntry& e : params_) out.emplace_back(e.name, *e.slot);
    return out;
  }
  std::unordered_set<const TensorImpl*> seen;  // a tensor shared by two slots is listed once
  for (const NamedSlot& s : const_cast<Module*>(this)->named_parameter_slots())
    if (seen.insert(s.slot->impl_ptr().get()).second) out.emplace_back(s.fqn, *s.slot);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (!recurse) {
    for (const TensorEntry& e : buffers_) out.emplace_back(e.name, *e.slot);
    return out;
  }
  std::unordered_set<const TensorImpl*> seen;
  for (const NamedSlot& s : const_cast<Module*>(this)->named_buffer_slots())
    if (seen.insert(s.slot->impl_ptr().get()).second) out.emplace_back(s.fqn, *s.slot);
  return out;
}

void Module::collect_modules(const std::string& prefix,
                             std::vector<std::pair<std::string, Module*>>& out) {
  out.emplace_back(prefix, this);
  for (auto& [name, child] : children_)
    child->collect_modules(prefix.empty() ? name : prefix + "." + name, out);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules("", out);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

Module& Module::submodule(const std::string& fqn) {
  Module* m = this;
  size_t pos = 0;
  while (pos < fqn.size()) {
    const size_t dot = fqn.find('.', pos);
    const std::string part =
        fqn.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    auto it = std::find_if(m->children_.begin(), m->children_.end(),
                           [&](const auto& c) { return c.first == part; });
    MT_CHECK(it != m->children_.end(), type_name_, ": no submodule '", fqn, "' (", m->type_name_,
             " at '", fqn.substr(0, pos == 0 ? 0 : pos - 1), "' has no child '", part, "')");
    m = it->second.get();
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return *m;
}

Tensor& Module::slot(const std::string& fqn) {
  const size_t dot = fqn.rfind('.');
  const std::string owner = dot == std::string::npos ? "" : fqn.substr(0, dot);
  const std::string name = dot == std::string::npos ? fqn : fqn.substr(dot + 1);
  Module& m = submodule(owner);
  for (const auto* list : {&m.params_, &m.buffers_})
    for (const TensorEntry& e : *list)
      if (e.name == name) return *e.slot;
  MT_FAIL(type_name_, ": no parameter or buffer named '", fqn, "'");
}

// ---- state ---------------------------------------------------------------------------------

StateDict Module::state_dict() const {
  // Per module: own parameters, own persistent buffers, then children.
  StateDict out;
  std::function<void(const Module*, const std::string&)> walk = [&](const Module* m,
                                                                    const std::string& pre) {
    for (const TensorEntry& e : m->params_) out.insert(pre + e.name, *e.slot);
    for (const TensorEntry& e : m->buffers_)
      if (e.persistent) out.insert(pre + e.name, *e.slot);
    for (auto& [name, child] : m->children_) walk(child.get(), pre + name + ".");
  };
  walk(this, "");
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  const StateDict own = state_dict();
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [key, t] : own) {
    const Tensor* src = state.find(key);
    if (src == nullptr) {
      missing.push_back(key);
      continue;
    }
    std::ostringstream os;
    if (!src->defined()) {
      os << "'" << key << "': expected shape " << t.shape() << " " << t.dtype()
         << ", found an undefined tensor";
    } else if (src->shape() != t.shape() || src->dtype() != t.dtype()) {
      os << "'" << key << "': expected shape " << t.shape() << " " << t.dtype() << ", found shape "
         << src->shape() << " " << src->dtype();
    }
    if (!os.str().empty()) mismatched.push_back(os.str());
  }
  for (const auto& [key, t] : state)
    if (!own.contains(key)) unexpected.push_back(key);

  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + ("'" + v[i] + "'");
    return s;
  };
  std::string err;
  if (strict && !missing.empty()) err += "\n  missing keys: " + join(missing);
  if (strict && !unexpected.empty()) err += "\n  unexpected keys: " + join(unexpected);
  for (const std::string& m : mismatched) err += "\n  mismatch for " + m;
  MT_CHECK(err.empty(), type_name_, ".load_state_dict: the state does not match the module:", err);

  NoGradGuard no_grad;
  for (const auto& [key, t] : own) {
    const Tensor* src = state.find(key);
    if (src != nullptr && !src->same(t)) t.copy_(*src);
  }
}

void Module::train(bool on) {
  for (auto& [name, m] : named_modules()) m->training_ = on;
}

// Calls fn(slot) once per distinct tensor, then points the other slots that held the same tensor
// at the result (so tied weights stay tied).
template <class Fn>
void Module::for_each_tensor(Fn&& fn) {
  // old impl -> {old tensor (kept alive so its address is not reused), replacement}
  std::unordered_map<const TensorImpl*, std::pair<Tensor, Tensor>> done;
  for (auto& [name, m] : named_modules()) {
    for (auto* list : {&m->params_, &m->buffers_}) {
      for (TensorEntry& e : *list) {
        Tensor& t = *e.slot;
        if (!t.defined()) continue;
        auto it = done.find(t.impl_ptr().get());
        if (it != done.end()) {
          t = it->second.second;
          continue;
        }
        const Tensor before = t;
        fn(t);
        done.emplace(before.impl_ptr().get(), std::pair{before, t});
      }
    }
  }
}

namespace {
// A new leaf holding `converted` (a new tensor), with `old`'s requires_grad, name and gradient
// (converted by `conv`).
template <class Conv>
Tensor replace_leaf(const Tensor& old, const Tensor& converted, Conv conv) {
  Tensor fresh = converted.detach();
  fresh.set_name(old.name());
  if (old.requires_grad()) fresh.set_requires_grad(true);
  const Tensor g = old.grad();
  if (g.defined()) fresh.set_grad(conv(g));
  return fresh;
}
}  // namespace

void Module::to(DType dtype) {
  NoGradGuard no_grad;
  auto conv = [dtype](const Tensor& t) { return t.to(dtype); };
  for_each_tensor([&](Tensor& t) {
    if (!t.defined() || !t.is_floating_point() || t.dtype() == dtype) return;
    t = replace_leaf(t, t.to(dtype), conv);
  });
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  auto conv = [device](const Tensor& t) { return t.to(device); };
  for_each_tensor([&](Tensor& t) {
    if (!t.defined() || t.device() == device) return;
    t = replace_leaf(t, t.to(device), conv);
  });
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (auto& [name, p] : named_parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      p.grad().zero_();
    }
  }
}

void Module::init_weights(uint64_t seed) {
  if (DeferredInitGuard::active()) return;
  for (auto& [name, m] : named_modules()) {
    m->reset_parameters(InitContext{seed, name.empty() ? "" : name + "."});
  }
}

// ---- hooks ---------------------------------------------------------------------------------

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  forward_pre_hooks_.push_back({next_hook_id_, std::move(hook)});
  return {next_hook_id_++};
}
HookHandle Module::register_forward_hook(ForwardHook hook) {
  forward_hooks_.push_back({next_hook_id_, std::move(hook)});
  return {next_hook_id_++};
}
HookHandle Module::register_backward_pre_hook(BackwardPreHook hook) {
  backward_pre_hooks_.push_back({next_hook_id_, std::move(hook)});
  return {next_hook_id_++};
}
HookHandle Module::register_backward_hook(BackwardHook hook) {
  backward_hooks_.push_back({next_hook_id_, std::move(hook)});
  return {next_hook_id_++};
}

bool Module::remove_hook(HookHandle handle) {
  auto erase = [&](auto& v) {
    const size_t before = v.size();
    v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& h) { return h.id == handle.id; }),
            v.end());
    return v.size() != before;
  };
  return erase(forward_pre_hooks_) || erase(forward_hooks_) || erase(backward_pre_hooks_) ||
         erase(backward_hooks_);
}

void Module::fire_backward_pre_hooks() {
  // Copy: a hook may register or remove hooks.
  auto hooks = backward_pre_hooks_;
  for (auto& h : hooks) h.fn(*this);
}

void Module::fire_backward_hooks() {
  auto hooks = backward_hooks_;
  for (auto& h : hooks) h.fn(*this);
}

Tensor Module::call(std::vector<Tensor> inputs, const Body& body) {
  MT_CHECK(body != nullptr, type_name_, ": call() with an empty body");
  std::vector<Tensor> out = call_multi(std::move(inputs), [body](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{body(in)};
  });
  MT_CHECK(out.size() == 1, type_name_, ": a forward hook changed the number of outputs from 1 to ",
           out.size());
  return out[0];
}

std::vector<Tensor> Module::call_multi(std::vector<Tensor> inputs, const MultiBody& body) {
  MT_CHECK(body != nullptr, type_name_, ": call() with an empty body");
  for (auto& h : std::vector(forward_pre_hooks_)) h.fn(*this, inputs);

  const bool grad_on = GradMode::enabled();
  const bool want_pre = grad_on && !backward_pre_hooks_.empty();
  const bool want_post = grad_on && !backward_hooks_.empty();
  std::shared_ptr<BackwardState> state;
  std::vector<Tensor> body_inputs = inputs;
  if (want_pre || want_post) state = std::make_shared<BackwardState>();

  if (want_post) {
    // Identity node on the inputs that require grad: it runs once all gradients w.r.t. them
    // have been computed inside the module.
    std::vector<size_t> where;
    std::vector<Tensor> originals, aliases;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].requires_grad()) {
        where.push_back(i);
        originals.push_back(inputs[i]);
        aliases.push_back(inputs[i].detach());
      }
    }
    if (!originals.empty()) {
      auto node = autograd::record(
          type_name_ + "BackwardHook", originals, aliases,
          [](const autograd::BackwardArgs& args) -> std::vector<Tensor> { return args.grads; });
      node->add_post_hook([this, state] {
        if (state->post_fired) return;
        state->post_fired = true;
        fire_backward_hooks();
      });
      state->post_via_node = true;
      for (size_t k = 0; k < where.size(); ++k) body_inputs[where[k]] = aliases[k];
    }
  }

  std::vector<Tensor> outputs;
  if (checkpointing_ && grad_on) {
    outputs = autograd::checkpoint_multi(body, body_inputs, checkpoint_keep_);
  } else {
    outputs = body(body_inputs);
  }

  for (auto& h : std::vector(forward_hooks_)) h.fn(*this, body_inputs, outputs);

  if (state) {
    for (Tensor& out : outputs) {
      if (!out.defined() || !out.requires_grad()) continue;
      const bool is_input = std::any_of(body_inputs.begin(), body_inputs.end(),
                                        [&](const Tensor& in) { return in.same(out); });
      if (out.is_leaf() || is_input) {
        // Hook a fresh alias, not a leaf (its hooks would outlive this call) or an input.
        Tensor alias = out.detach();
        autograd::record(
            type_name_ + "Output", {out}, {alias},
            [](const autograd::BackwardArgs& args) -> std::vector<Tensor> { return args.grads; });
        out = alias;
      }
      out.register_hook([this, state, want_post](const Tensor&) -> Tensor {
        if (state->pre_fired) return Tensor();
        state->pre_fired = true;
        fire_backward_pre_hooks();
        if (want_post && !state->post_via_node) {
          // No input requires grad: the module's backward is done when the whole pass is.
          autograd::queue_callback([this, state] {
            if (state->post_fired) return;
            state->post_fired = true;
            fire_backward_hooks();
          });
        }
        return Tensor();
      });
    }
  }
  return outputs;
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  MT_CHECK(i < items_.size(), "ModuleList: index ", i, " out of range for ", items_.size(),
           " modules");
  return items_[i];
}

}  // namespace mt::runtime::nn
