// The runtime trains: a 2-layer MLP fitted with AdamW (warmup + cosine) to a fixed synthetic
// classification task (labels from a random "teacher" map) reaches a loss threshold, and the
// per-step losses with 1 and 2 OpenMP threads agree (to 1e-6).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "runtime/nn/linear.h"
#include "runtime/nn/module.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/lr_scheduler.h"

namespace mt::runtime {
namespace {

constexpr int64_t kIn = 32, kHidden = 128, kClasses = 8, kBatch = 512;

class Mlp : public nn::Module {
 public:
  Mlp() : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kIn, kHidden));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(kHidden, kClasses));
  }
  Tensor operator()(const Tensor& x) {
    return call({x}, [this](const std::vector<Tensor>& in) { return (*fc2)(relu((*fc1)(in[0]))); });
  }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

std::vector<double> train(int threads, int steps) {
  omp_set_num_threads(threads);
  Mlp model;
  model.init_weights(42);
  optim::AdamW opt(model.named_parameters(), optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.01});
  optim::LRScheduler sched(
      opt, steps, optim::WarmupStableDecay{5, std::nullopt, optim::DecayType::Cosine, 0.1});
  const Tensor teacher = randn({kIn, kClasses}, RandomKey(7, "teacher"));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    // A fresh batch every step, keyed by the step.
    const Tensor x = randn({kBatch, kIn}, RandomKey(7, "x", uint64_t(step)));
    const Tensor y = argmax(matmul(x, teacher), 1);
    const Tensor loss = cross_entropy(model(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    sched.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

TEST(TrainDeterminism, ReachesThresholdAndAgreesAcrossThreadCounts) {
  const int steps = 40;
  const int saved = omp_get_max_threads();
  const auto one = train(1, steps);
  const auto two = train(2, steps);
  const auto two_again = train(2, 5);
  omp_set_num_threads(saved);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(one[i], two[i], 1e-6 * std::max(1.0, std::abs(one[i]))) << "step " << i;
  }
  // ln(8) = 2.08 at the start; the fit must be well below.
  EXPECT_GT(one.front(), 1.5);
  EXPECT_LT(one.back(), 0.5) << "loss went from " << one.front() << " to " << one.back();
  // And deterministic run to run.
  // (5 steps: all in the warmup, where the lrs of both schedules agree.)
  EXPECT_EQ(two_again, std::vector<double>(two.begin(), two.begin() + 5));
}

}  // namespace
}  // namespace mt::runtime
