// Learning-rate schedules, torchtitan-style warmup-stable-decay (WSD), applied as a factor of
// each group's base lr (the lr the group had when the scheduler was built), like torch LambdaLR.
// The formula is current torchtitan's (components/lr_scheduler.py, the one with min_lr_factor).
//
// With N = training_steps, W = warmup_steps (clamped to N) and D = decay steps:
//   D = round(N * decay_ratio) (half to even, as Python), reduced to N - W when W + D > N;
//       without a decay_ratio, D = N - W (decay right after warmup).
//   S = N + 1 - W - D: the stable steps, with a virtual last step, so that the last training
//       step still runs above min_lr_factor (it reaches min_lr_factor only after the run).
//   factor(s), for the 0-based step s (s is clamped to N):
//     s < W          (s + 1) / W                     linear warmup, reaching 1 at its last step
//     s < W + S      1                               stable
//     otherwise      p = (s + 1 - W - S) / D         decay progress in (0, 1]
//                    m + (1 - m) * c(p), c = 1 - p (linear), 1 - sqrt(p) (sqrt) or
//                    (1 + cos(pi p)) / 2 (cosine), m = min_lr_factor
// min_lr_factor is a factor of the base lr. Note: the decay ratio is a share of ALL training
// steps (as torchtitan's decay_ratio), not of the steps left after warmup.
//
// Usage: build after the optimizer (the group lrs become base * factor(0) at once); call step()
// after each optimizer.step(), so training step k (1-based) runs with factor(k - 1).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "runtime/nn/state_dict.h"
#include "runtime/optim/optimizer.h"

namespace mt::runtime::optim {

enum class DecayType : uint8_t { Linear, Sqrt, Cosine };
// "linear", "sqrt", "cosine"; throws naming the valid names.
DecayType decay_type_from_name(std::string_view name);
std::string_view decay_type_name(DecayType type);

struct WarmupStableDecay {
  int64_t warmup_steps = 0;
  std::optional<double> decay_ratio =
      std::nullopt;  // in [0, 1]; nullopt: decay over all steps after warmup
  DecayType decay_type = DecayType::Linear;
  double min_lr_factor = 0.0;  // in [0, 1], a factor of the base lr
};

// The resolved phase lengths of a schedule over `training_steps`.
struct WsdPhases {
  int64_t warmup = 0, stable = 0, decay = 0;
};
WsdPhases resolve_phases(const WarmupStableDecay& schedule, int64_t training_steps);
// The lr factor at 0-based step `step` (see the header comment).
double wsd_factor(int64_t step, const WsdPhases& phases, DecayType type, double min_lr_factor);

class LRScheduler {
 public:
  LRScheduler(Optimizer& optimizer, int64_t training_steps, WarmupStableDecay schedule);

  // Advances one step and sets every group's lr to base_lr * factor(last_step()).
  void step();
  double factor(int64_t step) const;
  double get_lr(size_t group = 0) const;  // the lr now set on the group
  std::vector<double> get_lrs() const;
  int64_t last_step() const { return last_step_; }
  const WsdPhases& phases() const { return phases_; }

  // {"last_step": 0-D i64}. Loading restores the step and re-applies the lrs.
  nn::StateDict state_dict() const;
  void load_state_dict(const nn::StateDict& state);

 private:
  void apply();

  Optimizer& optimizer_;
  int64_t training_steps_;
  WarmupStableDecay schedule_;
  WsdPhases phases_;
  std::vector<double> base_lrs_;
  int64_t last_step_ = 0;
};

}  // namespace mt::runtime::optim
