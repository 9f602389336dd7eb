// Optimizer: the base of SGD and AdamW (torch.optim semantics).
//
// Parameters come in groups, each with its own hyper-parameters. step() updates, in place and
// under no_grad, every parameter that has a gradient (the others are skipped and get no state),
// with fused kernels (runtime/kernels/optim.h: one per parameter, or one per group of parameters
// sharing a device and dtype where the optimizer has a multi-tensor kernel, as AdamW), and bumps the parameters'
// versions. State is created lazily at a parameter's first update: step count plus f32 tensors
// (f64 for f64 parameters) shaped like the parameter.
//
// The optimizer holds the parameter tensors themselves: build it after the model's final
// placement (Module::to, sharding), since those replace the tensors in their slots.
//
// state_dict() is a flat StateDict of named tensors, keyed by parameter FQN when the optimizer
// was given named parameters (else "<group>.<index>"):
//   state.<key>.step            0-D i64: updates applied to this parameter
//   state.<key>.<state name>    e.g. exp_avg, exp_avg_sq (AdamW), momentum_buffer (SGD)
//   param_groups.<g>.<hyper>    0-D f64: lr, weight_decay, betas, ...
// load_state_dict() checks everything first (unknown keys, missing keys, shapes, dtypes; all
// problems in one message) and only then replaces the state and the hyper-parameters.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/nn/state_dict.h"

namespace mt::runtime::optim {

using nn::StateDict;

// A group of parameters and its hyper-parameters (each optimizer reads the ones it uses).
struct ParamGroup {
  std::vector<Tensor> params;
  std::vector<std::string> names;  // FQNs, one per param, or empty
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW
  double momentum = 0.0, dampening = 0.0;         // SGD
  bool nesterov = false;                          // SGD
};

// Per-parameter state: update count and the optimizer's state tensors (see state_names()).
struct ParamState {
  bool initialized = false;
  int64_t step = 0;
  std::vector<Tensor> tensors;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  const std::string& name() const { return name_; }

  // Updates every parameter with a gradient (no_grad). grad_scale (undefined: none), a one-element
  // f64 tensor on the parameters' device, folds clipping into the update: each gradient counts as
  // clip_grads_with_norm_ would leave it after multiplying by grad_scale (clip_coefficient(),
  // runtime/optim/clip_grad.h), but stays as it is. Multi-tensor kernels apply it as they read
  // (no extra pass); other optimizers get scaled copies.
  void step(const Tensor& grad_scale = Tensor());
  // Drops (set_to_none) or zeroes the gradients of all parameters.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  void set_lr(double lr);  // every group
  void set_lr(size_t group, double lr);
  double lr(size_t group = 0) const;

  // The names of the state tensors, in ParamState::tensors order.
  const std::vector<std::string>& state_names() const { return state_names_; }
  // The state of param `index` of group `group` (initialized == false before its first update).
  const ParamState& state(size_t group, size_t index) const;
  // The key of a parameter in state_dict(): its FQN, or "<group>.<index>".
  std::string param_key(size_t group, size_t index) const;

  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 protected:
  Optimizer(std::string name, std::vector<ParamGroup> groups, std::vector<std::string> state_names);

  // Fresh state tensors for `param` (default: zeros of the state dtype, one per state name).
  virtual std::vector<Tensor> init_state(const ParamGroup& group, const Tensor& param) const;
  // Applies one update (state.step already incremented). param, grad contiguous, grad in the
  // param's dtype.
  virtual void update(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                      ParamState& state) = 0;
  // One parameter's update as step() hands it over (contiguous param, grad in its dtype).
  struct UpdateItem {
    Tensor param, grad;
    ParamState* state;
  };
  // Updates every item of one group; the default calls update() on each (with scaled copies of
  // the gradients when grad_scale is defined, see step()). Optimizers with a multi-tensor kernel
  // override it to update many parameters per launch.
  virtual void update_group(const ParamGroup& group, std::vector<UpdateItem>& items,
                            const Tensor& grad_scale);
  // The group's hyper-parameters saved in state_dict() (pointers into `group`).
  virtual std::vector<std::pair<std::string, double*>> hyperparams(ParamGroup& group) const;
  // Throws naming the optimizer and the bad value.
  virtual void validate(const ParamGroup& group, size_t index) const;

  // Hyper-parameter vector with the common entries (lr, weight_decay).
  static std::vector<std::pair<std::string, double*>> common_hyperparams(ParamGroup& group);

  void check_groups() const;  // call at the end of derived constructors

 private:
  std::string name_;
  std::vector<ParamGroup> groups_;
  std::vector<std::string> state_names_;
  std::vector<std::vector<ParamState>> state_;
};

// The dtype of optimizer state for a parameter of dtype `param`: f64 for f64, f32 otherwise.
DType state_dtype_for(DType param);

// Named parameters -> one group (keeping the names for FQN-keyed state).
ParamGroup make_group(const std::vector<std::pair<std::string, Tensor>>& named_params);
ParamGroup make_group(const std::vector<Tensor>& params);

}  // namespace mt::runtime::optim
