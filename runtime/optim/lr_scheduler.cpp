#include "runtime/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "runtime/ops/factory.h"

namespace mt::runtime::optim {

DecayType decay_type_from_name(std::string_view name) {
  if (name == "linear") return DecayType::Linear;
  if (name == "sqrt") return DecayType::Sqrt;
  if (name == "cosine") return DecayType::Cosine;
  MT_FAIL("lr scheduler: unknown decay type '", name, "' (expected linear, sqrt or cosine)");
}

std::string_view decay_type_name(DecayType type) {
  switch (type) {
    case DecayType::Linear:
      return "linear";
    case DecayType::Sqrt:
      return "sqrt";
    case DecayType::Cosine:
      return "cosine";
  }
  return "?";
}

WsdPhases resolve_phases(const WarmupStableDecay& s, int64_t training_steps) {
  MT_CHECK(training_steps > 0, "lr scheduler: training_steps must be > 0, got ", training_steps);
  MT_CHECK(s.warmup_steps >= 0, "lr scheduler: warmup_steps must be >= 0, got ", s.warmup_steps);
  MT_CHECK(!s.decay_ratio || (*s.decay_ratio >= 0 && *s.decay_ratio <= 1),
           "lr scheduler: decay_ratio must be in [0, 1], got ", s.decay_ratio.value_or(0));
  MT_CHECK(s.min_lr_factor >= 0 && s.min_lr_factor <= 1,
           "lr scheduler: min_lr_factor must be in [0, 1], got ", s.min_lr_factor);
  WsdPhases p;
  p.warmup = std::min(s.warmup_steps, training_steps);
  if (s.decay_ratio) {
    p.decay = int64_t(std::nearbyint(double(training_steps) * *s.decay_ratio));  // half to even
    if (p.warmup + p.decay > training_steps) p.decay = training_steps - p.warmup;
  } else {
    p.decay = training_steps - p.warmup;
  }
  p.stable = training_steps + 1 - p.warmup - p.decay;  // with the virtual last step
  return p;
}

double wsd_factor(int64_t step, const WsdPhases& p, DecayType type, double min_lr_factor) {
  MT_CHECK(step >= 0, "lr scheduler: step must be >= 0, got ", step);
  step = std::min(step, p.warmup + p.stable + p.decay - 1);  // N: the step after the run
  if (step < p.warmup) return double(step + 1) / double(p.warmup);
  if (step < p.warmup + p.stable || p.decay == 0) return 1.0;
  const double progress = double(step + 1 - p.warmup - p.stable) / double(p.decay);
  double c = 0.0;
  switch (type) {
    case DecayType::Linear:
      c = 1.0 - progress;
      break;
    case DecayType::Sqrt:
      c = 1.0 - std::sqrt(progress);
      break;
    case DecayType::Cosine:
      c = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
      break;
  }
  return min_lr_factor + (1.0 - min_lr_factor) * c;
}

LRScheduler::LRScheduler(Optimizer& optimizer, int64_t training_steps, WarmupStableDecay schedule)
    : optimizer_(optimizer),
      training_steps_(training_steps),
      schedule_(schedule),
      phases_(resolve_phases(schedule, training_steps)) {
  for (const ParamGroup& g : optimizer_.param_groups()) base_lrs_.push_back(g.lr);
  apply();
}

double LRScheduler::factor(int64_t step) const {
  return wsd_factor(step, phases_, schedule_.decay_type, schedule_.min_lr_factor);
}

void LRScheduler::apply() {
  const double f = factor(last_step_);
  for (size_t g = 0; g < base_lrs_.size(); ++g) optimizer_.set_lr(g, base_lrs_[g] * f);
}

void LRScheduler::step() {
  ++last_step_;
  apply();
}

double LRScheduler::get_lr(size_t group) const { return optimizer_.lr(group); }

std::vector<double> LRScheduler::get_lrs() const {
  std::vector<double> out;
  for (size_t g = 0; g < base_lrs_.size(); ++g) out.push_back(optimizer_.lr(g));
  return out;
}

nn::StateDict LRScheduler::state_dict() const {
  nn::StateDict out;
  out.insert("last_step",
             scalar_tensor(double(last_step_), TensorOptions{}.with_dtype(DType::I64)));
  return out;
}

void LRScheduler::load_state_dict(const nn::StateDict& state) {
  const Tensor* t = state.find("last_step");
  MT_CHECK(t != nullptr, "LRScheduler.load_state_dict: missing key 'last_step'");
  for (const auto& [key, v] : state)
    MT_CHECK(key == "last_step", "LRScheduler.load_state_dict: unexpected key '", key, "'");
  MT_CHECK(t->defined() && t->numel() == 1 && is_integral(t->dtype()),
           "LRScheduler.load_state_dict: 'last_step' must be a one-element integer tensor");
  const int64_t s = t->item<int64_t>();
  MT_CHECK(s >= 0, "LRScheduler.load_state_dict: 'last_step' is negative (", s, ")");
  last_step_ = s;
  apply();
}

}  // namespace mt::runtime::optim
