// Warmup-stable-decay LR schedule: phase lengths and exact factors at the boundaries, the
// scheduler driving an optimizer's groups, and its state_dict.
#include "runtime/optim/lr_scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "runtime/ops/factory.h"
#include "runtime/optim/sgd.h"

namespace mt::runtime::optim {
namespace {

// The phases of current torchtitan's build_lr_schedulers: the stable phase has one virtual step
// more, so that the decay ends after the run.
TEST(LRSchedule, PhasesFollowTorchtitan) {
  WarmupStableDecay s{10, 0.2, DecayType::Linear, 0.0};
  WsdPhases p = resolve_phases(s, 100);
  EXPECT_EQ(p.warmup, 10);
  EXPECT_EQ(p.decay, 20);
  EXPECT_EQ(p.stable, 71);
  // No decay ratio: decay right after warmup.
  s.decay_ratio.reset();
  p = resolve_phases(s, 100);
  EXPECT_EQ(p.decay, 90);
  EXPECT_EQ(p.stable, 1);
  // warmup + decay > steps: decay is cut to the steps after warmup.
  s.decay_ratio = 0.95;
  p = resolve_phases(s, 100);
  EXPECT_EQ(p.decay, 90);
  EXPECT_EQ(p.stable, 1);
  // round() is half-to-even like Python: 10 * 0.25 = 2.5 -> 2, 10 * 0.35 = 3.5 -> 4.
  s = WarmupStableDecay{0, 0.25};
  EXPECT_EQ(resolve_phases(s, 10).decay, 2);
  s.decay_ratio = 0.35;
  EXPECT_EQ(resolve_phases(s, 10).decay, 4);
  // warmup longer than training is clamped.
  s = WarmupStableDecay{50};
  p = resolve_phases(s, 20);
  EXPECT_EQ(p.warmup, 20);
  EXPECT_EQ(p.decay, 0);
  EXPECT_EQ(p.stable, 1);
  EXPECT_THROW(resolve_phases(WarmupStableDecay{-1}, 10), Error);
  EXPECT_THROW(resolve_phases(WarmupStableDecay{0, 1.5}, 10), Error);
  EXPECT_THROW(resolve_phases(WarmupStableDecay{0}, 0), Error);
}

// The factors torchtitan's linear_warmup_stable_decay gives (values worked out from its code).
TEST(LRSchedule, ExactFactorsAtBoundaries) {
  const WsdPhases p = resolve_phases(WarmupStableDecay{10, 0.2}, 100);  // {10, 71, 20}
  // Warmup: (s + 1) / W, at the peak on its last step.
  EXPECT_DOUBLE_EQ(wsd_factor(0, p, DecayType::Linear, 0.0), 1.0 / 10.0);
  EXPECT_EQ(wsd_factor(9, p, DecayType::Linear, 0.0), 1.0);
  // Stable: steps 10 to 80.
  EXPECT_EQ(wsd_factor(10, p, DecayType::Linear, 0.0), 1.0);
  EXPECT_EQ(wsd_factor(80, p, DecayType::Linear, 0.0), 1.0);
  // Decay: progress = (s + 1 - 81) / 20; the last step (99) stays above min_lr_factor.
  EXPECT_DOUBLE_EQ(wsd_factor(81, p, DecayType::Linear, 0.0), 1.0 - 1.0 / 20.0);
  EXPECT_DOUBLE_EQ(wsd_factor(99, p, DecayType::Linear, 0.0), 1.0 - 19.0 / 20.0);
  EXPECT_DOUBLE_EQ(wsd_factor(99, p, DecayType::Linear, 0.1), 0.1 + 0.9 * (1.0 / 20.0));
  EXPECT_DOUBLE_EQ(wsd_factor(89, p, DecayType::Sqrt, 0.0), 1.0 - std::sqrt(9.0 / 20.0));
  EXPECT_DOUBLE_EQ(wsd_factor(89, p, DecayType::Cosine, 0.2),
                   0.2 + 0.8 * 0.5 * (1.0 + std::cos(std::numbers::pi * 9.0 / 20.0)));
  // After the run: clamped to progress 1 -> min_lr_factor.
  EXPECT_NEAR(wsd_factor(100, p, DecayType::Cosine, 0.1), 0.1, 1e-15);
  EXPECT_NEAR(wsd_factor(500, p, DecayType::Linear, 0.25), 0.25, 1e-15);
  // No decay phase: 1 after warmup.
  EXPECT_EQ(wsd_factor(50, resolve_phases(WarmupStableDecay{10, 0.0}, 100), DecayType::Cosine,
                       0.0),
            1.0);
  // No warmup: step 0 runs at the peak (the one stable step), then the decay.
  const WsdPhases no_warmup = resolve_phases(WarmupStableDecay{0}, 9);  // {0, 1, 9}
  EXPECT_EQ(wsd_factor(0, no_warmup, DecayType::Linear, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(wsd_factor(1, no_warmup, DecayType::Linear, 0.0), 8.0 / 9.0);
  EXPECT_DOUBLE_EQ(wsd_factor(8, no_warmup, DecayType::Linear, 0.0), 1.0 / 9.0);
  // A warmup as long as the run ends at the peak.
  const WsdPhases all_warmup = resolve_phases(WarmupStableDecay{50}, 20);
  EXPECT_EQ(wsd_factor(19, all_warmup, DecayType::Linear, 0.0), 1.0);
  EXPECT_THROW(wsd_factor(-1, p, DecayType::Linear, 0.0), Error);
}

TEST(LRSchedule, DecayTypeNames) {
  EXPECT_EQ(decay_type_from_name("cosine"), DecayType::Cosine);
  EXPECT_EQ(decay_type_from_name("sqrt"), DecayType::Sqrt);
  EXPECT_EQ(decay_type_name(DecayType::Linear), "linear");
  try {
    decay_type_from_name("exp");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown decay type 'exp'"), std::string::npos);
  }
}

TEST(LRScheduler, DrivesOptimizerGroups) {
  Tensor a = zeros({1}), b = zeros({1});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  ParamGroup ga = make_group({a}), gb = make_group({b});
  ga.lr = 1.0;
  gb.lr = 0.5;
  SGD opt({ga, gb});
  LRScheduler sched(opt, 10, WarmupStableDecay{4, 0.5, DecayType::Linear, 0.0});
  // phases: warmup 4, decay 5, stable 2 (one of them virtual)
  EXPECT_EQ(sched.phases().stable, 2);
  // At construction the lr is already base * factor(0).
  EXPECT_DOUBLE_EQ(sched.get_lr(0), 1.0 / 4.0);
  EXPECT_DOUBLE_EQ(sched.get_lr(1), 0.5 / 4.0);
  std::vector<double> lrs{sched.get_lr()};
  for (int s = 1; s < 10; ++s) {
    sched.step();
    lrs.push_back(sched.get_lr());
  }
  const std::vector<double> expected{0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2};
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(lrs[i], expected[i], 1e-15) << i;
  EXPECT_NEAR(sched.get_lrs()[1], 0.5 * 0.2, 1e-15);
  EXPECT_EQ(sched.last_step(), 9);

  // state_dict round trip onto a fresh scheduler.
  SGD opt2({ga, gb});
  LRScheduler sched2(opt2, 10, WarmupStableDecay{4, 0.5, DecayType::Linear, 0.0});
  sched2.load_state_dict(sched.state_dict());
  EXPECT_EQ(sched2.last_step(), 9);
  EXPECT_NEAR(opt2.lr(0), 0.2, 1e-15);
  nn::StateDict bad;
  bad.insert("step", scalar_tensor(3, TensorOptions{}.with_dtype(DType::I64)));
  EXPECT_THROW(sched2.load_state_dict(bad), Error);
}

}  // namespace
}  // namespace mt::runtime::optim
