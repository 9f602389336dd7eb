// Module: the base of the nn layers and models (Linear, Embedding, RMSNorm, transformer blocks).
//
// A module owns its parameters and buffers as plain `Tensor` members and registers *pointers* to
// them (slots), so that code outside the module (FSDP, to(), load_state_dict) can swap the tensor
// a slot holds and the module's forward picks up the new one:
//
//   class Mlp : public nn::Module {
//    public:
//     Mlp(int64_t d, int64_t h) : Module("Mlp") {
//       up = register_module("up", std::make_shared<nn::Linear>(d, h));
//       down = register_module("down", std::make_shared<nn::Linear>(h, d));
//     }
//     Tensor operator()(const Tensor& x) {
//       return call({x}, [this](const std::vector<Tensor>& in) {
//         return (*down)(relu((*up)(in[0])));
//       });
//     }
//     std::shared_ptr<nn::Linear> up, down;
//   };
//
// Conventions
// - Modules are neither copyable nor movable (slots point into them); hold them by shared_ptr.
// - Names are fully qualified (FQN) with '.', children and tensors in registration order:
//   "layers.0.attention.wq.weight". A module's own tensors come before its children's.
// - Forward goes through call()/call_multi(), which runs the hooks around the body. The body
//   must use the inputs it is given (hooks may replace them) and capture only by value (`this`
//   included): with activation checkpointing on, it runs again during backward.
// - Hooks capture the module by raw pointer: a module must outlive the backward passes of the
//   graphs it recorded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/autograd/selective_checkpoint.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/init.h"
#include "runtime/nn/state_dict.h"

namespace mt::runtime::nn {

class Module;

// Called before the body with the inputs; may replace them (e.g. cast to a compute dtype).
using ForwardPreHook = std::function<void(Module& module, std::vector<Tensor>& inputs)>;
// Called after the body with the inputs the body saw and its outputs; may replace the outputs.
using ForwardHook = std::function<void(Module& module, const std::vector<Tensor>& inputs,
                                       std::vector<Tensor>& outputs)>;
// Called once per forward call when the first gradient w.r.t. the module's outputs is about to
// flow into the module (before any of its backward ops run).
using BackwardPreHook = std::function<void(Module& module)>;
// Called once per forward call after the gradients w.r.t. the module's inputs are computed (and
// so after its parameters' gradients); when no input requires grad, at the end of backward.
using BackwardHook = std::function<void(Module& module)>;

// Identifies a registered hook for remove_hook().
struct HookHandle {
  uint64_t id = 0;
};

// A parameter or buffer slot with its fully qualified name.
struct NamedSlot {
  std::string fqn;
  Tensor* slot = nullptr;
  Module* owner = nullptr;  // the module that registered it
  std::string local_name;   // its name inside `owner`
};

class Module {
 public:
  explicit Module(std::string type_name);
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = delete;
  Module& operator=(Module&&) = delete;

  const std::string& type_name() const { return type_name_; }

  // ---- registration (names: non-empty, no '.', unique within the module) --------------------
  // Registers `member` as a parameter (a leaf; requires_grad set as given) and returns it.
  Tensor& register_parameter(const std::string& name, Tensor& member, bool requires_grad = true);
  // Registers `member` as a buffer; non-persistent buffers are left out of state_dict().
  Tensor& register_buffer(const std::string& name, Tensor& member, bool persistent = true);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  // Swaps the registered child `name` for `module` (same place in the registration order, so
  // FQNs are kept) and returns the old one; throws naming `name` when there is no such child.
  // Hooks registered on the old module stay with it.
  std::shared_ptr<Module> replace_module(const std::string& name, std::shared_ptr<Module> module);

  // ---- traversal (registration order; a module's own tensors before its children's) --------
  // A tensor held by several slots (tied weights) is listed once, under its first FQN.
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  // This module first (name ""), then every descendant, depth first.
  std::vector<std::pair<std::string, Module*>> named_modules();
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // Mutable slots, for code that swaps the tensors a module holds (FSDP, to()).
  std::vector<NamedSlot> named_parameter_slots();
  std::vector<NamedSlot> named_buffer_slots();
  // The slot of parameter or buffer `fqn`; throws naming the FQN when there is none.
  Tensor& slot(const std::string& fqn);
  // The descendant at `fqn` ("" is this module); throws naming the missing part.
  Module& submodule(const std::string& fqn);

  // ---- state ---------------------------------------------------------------------------------
  // Parameters and persistent buffers by FQN, in registration order. The tensors are the
  // module's own (not copies); detach/clone before modifying them.
  StateDict state_dict() const;
  // Copies values into the existing tensors (no_grad). Throws, naming the FQNs, on missing or
  // unexpected keys (strict; both listed in one message) and on shape or dtype mismatches
  // (always). Nothing is copied when a check fails.
  void load_state_dict(const StateDict& state, bool strict = true);

  // Recursive training/evaluation mode.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Replaces floating parameters and buffers (and their gradients) by converted copies in their
  // slots, keeping requires_grad. Optimizers made before this keep the old tensors.
  void to(DType dtype);
  // Moves every parameter and buffer (and gradient) to `device` the same way.
  void to(Device device);

  // Drops (set_to_none) or zeroes every parameter's gradient.
  void zero_grad(bool set_to_none = true);

  // ---- initialisation ------------------------------------------------------------------------
  // Calls reset_parameters on this module and every descendant (each with its own FQN prefix),
  // so each parameter is drawn from RandomKey(seed, its FQN). Nothing under DeferredInitGuard.
  void init_weights(uint64_t seed);
  // Re-initialises this module's own parameters (not its children's). Default: nothing.
  virtual void reset_parameters(const InitContext& ctx) {}

  // ---- activation checkpointing --------------------------------------------------------------
  // When on, call() runs the body under autograd::checkpoint: its activations are not kept, and the
  // body runs again during backward. Hooks stay outside the checkpointed region. With a
  // `keep` policy, the outputs of the ops it names are kept and reused instead of recomputed
  // (op-level selective checkpointing, runtime/autograd/selective_checkpoint.h).
  void set_activation_checkpointing(bool on, autograd::SavePolicy keep = nullptr) {
    checkpointing_ = on;
    checkpoint_keep_ = on ? std::move(keep) : nullptr;
  }
  bool activation_checkpointing() const { return checkpointing_; }

  // ---- hooks ---------------------------------------------------------------------------------
  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  HookHandle register_forward_hook(ForwardHook hook);
  HookHandle register_backward_pre_hook(BackwardPreHook hook);
  HookHandle register_backward_hook(BackwardHook hook);
  // Removes a hook of any kind; false when it is not (or no longer) registered.
  bool remove_hook(HookHandle handle);

 protected:
  using Body = std::function<Tensor(const std::vector<Tensor>& inputs)>;
  using MultiBody = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;
  // Runs forward pre-hooks, the body (checkpointed when enabled), forward hooks, and arms the
  // backward hooks. Concrete modules' operator() call this.
  Tensor call(std::vector<Tensor> inputs, const Body& body);
  std::vector<Tensor> call_multi(std::vector<Tensor> inputs, const MultiBody& body);

 private:
  struct TensorEntry {
    std::string name;
    Tensor* slot;
    bool persistent;
  };
  template <class Fn>
  struct Hook {
    uint64_t id;
    Fn fn;
  };
  struct BackwardState;

  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name, const char* what) const;
  void collect_slots(const std::string& prefix, bool buffers, bool persistent_only,
                     std::vector<NamedSlot>& out);
  void collect_modules(const std::string& prefix,
                       std::vector<std::pair<std::string, Module*>>& out);
  void fire_backward_pre_hooks();
  void fire_backward_hooks();
  template <class Fn>
  void for_each_tensor(Fn&& fn);

  std::string type_name_;
  std::vector<TensorEntry> params_;
  std::vector<TensorEntry> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  bool checkpointing_ = false;
  autograd::SavePolicy checkpoint_keep_;
  uint64_t next_hook_id_ = 1;
  std::vector<Hook<ForwardPreHook>> forward_pre_hooks_;
  std::vector<Hook<ForwardHook>> forward_hooks_;
  std::vector<Hook<BackwardPreHook>> backward_pre_hooks_;
  std::vector<Hook<BackwardHook>> backward_hooks_;
};

// Holds child modules registered under "0", "1", ... (e.g. a model's `layers`).
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(items_.size()), module);
    items_.push_back(module);
    return module;
  }
  size_t size() const { return items_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return items_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return items_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

}  // namespace mt::runtime::nn
