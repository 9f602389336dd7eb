#include "runtime/autograd/checkpoint.h"

#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/selective_checkpoint.h"
#include "runtime/core/grad_mode.h"

namespace mt::runtime::autograd {

namespace {

thread_local CheckpointPhase current_phase = CheckpointPhase::None;

// Sets the phase for a scope; a Forward inside a Recompute stays Recompute.
class PhaseGuard {
 public:
  explicit PhaseGuard(CheckpointPhase phase) : prev_(current_phase) {
    current_phase = prev_ == CheckpointPhase::Recompute ? prev_ : phase;
  }
  ~PhaseGuard() { current_phase = prev_; }
  PhaseGuard(const PhaseGuard&) = delete;
  PhaseGuard& operator=(const PhaseGuard&) = delete;

 private:
  CheckpointPhase prev_;
};

}  // namespace

CheckpointPhase checkpoint_phase() { return current_phase; }

std::vector<Tensor> checkpoint_multi(const CheckpointMultiFn& fn, const std::vector<Tensor>& inputs,
                                     const SavePolicy& policy) {
  MT_CHECK(fn != nullptr, "checkpoint: empty function");
  if (!GradMode::enabled()) {
    // Not counted by an enclosing region's policy, as this region's own run is not either.
    KeptOutputs::Scope suspend(nullptr, KeptOutputs::Mode::Keep);
    return fn(inputs);
  }

  auto kept = policy ? std::make_shared<KeptOutputs>(policy) : nullptr;
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    PhaseGuard phase(CheckpointPhase::Forward);
    KeptOutputs::Scope keep(kept.get(), KeptOutputs::Mode::Keep);
    outputs = fn(inputs);
  }
  // Fresh handles (sharing storage) so that recording never touches a tensor fn returned as is
  // (an input or a parameter).
  for (size_t i = 0; i < outputs.size(); ++i) {
    MT_CHECK(outputs[i].defined(), "checkpoint: output ", i, " is undefined");
    MT_CHECK(outputs[i].is_floating_point(), "checkpoint: output ", i,
             " must be floating to carry a gradient, got ", outputs[i].dtype());
    outputs[i] = outputs[i].detach();
  }

  std::vector<SavedTensor> saved;
  std::vector<bool> input_requires_grad;
  saved.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    saved.emplace_back(in);
    input_requires_grad.push_back(in.defined() && in.requires_grad());
  }

  record("CheckpointBackward", inputs, outputs,
         [fn, saved = std::move(saved), input_requires_grad,
          kept](const BackwardArgs& args) -> std::vector<Tensor> {
           std::vector<Tensor> detached;
           detached.reserve(saved.size());
           for (size_t i = 0; i < saved.size(); ++i) {
             if (!saved[i].defined()) {
               detached.emplace_back();
               continue;
             }
             Tensor d = saved[i].get().detach();  // get() checks the version
             if (input_requires_grad[i]) d.set_requires_grad(true);
             detached.push_back(d);
           }
           std::vector<Tensor> recomputed;
           {
             EnableGradGuard grad_on;
             PhaseGuard phase(CheckpointPhase::Recompute);
             KeptOutputs::Scope reuse(kept.get(), KeptOutputs::Mode::Reuse);
             recomputed = fn(detached);
           }
           MT_CHECK(recomputed.size() == args.grads.size(), "checkpoint: the recompute returned ",
                    recomputed.size(), " outputs, the forward ", args.grads.size());
           std::vector<Tensor> roots, root_grads;
           for (size_t i = 0; i < recomputed.size(); ++i) {
             MT_CHECK(recomputed[i].shape() == args.grads[i].shape(), "checkpoint: output ", i,
                      " has shape ", recomputed[i].shape(), " in the recompute but ",
                      args.grads[i].shape(), " in the forward (fn is not deterministic)");
             if (recomputed[i].requires_grad()) {
               roots.push_back(recomputed[i]);
               root_grads.push_back(args.grads[i]);
             }
           }
           if (!roots.empty()) backward(roots, root_grads);
           std::vector<Tensor> grads(detached.size());
           for (size_t i = 0; i < detached.size(); ++i) {
             if (args.needs(i) && input_requires_grad[i]) grads[i] = detached[i].grad();
           }
           return grads;
         });
  return outputs;
}

Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                  const SavePolicy& policy) {
  MT_CHECK(fn != nullptr, "checkpoint: empty function");
  return checkpoint_multi(
      [fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in)}; }, inputs,
      policy)[0];
}

}  // namespace mt::runtime::autograd
