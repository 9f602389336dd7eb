// Activation checkpointing (autograd::checkpoint and Module::set_activation_checkpointing):
// gradients equal the plain ones, parameters inside the region get theirs, memory peaks lower.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/autograd/checkpoint.h"
#include "runtime/autograd/gradcheck.h"
#include "runtime/core/allocator.h"
#include "runtime/core/grad_mode.h"
#include "runtime/nn/linear.h"
#include "runtime/nn/module.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::randn64;

TensorOptions f64() { return TensorOptions{}.with_dtype(DType::F64); }

// Linear -> tanh -> Linear.
class Mlp : public nn::Module {
 public:
  Mlp(int64_t d, int64_t h, TensorOptions opt) : Module("Mlp") {
    up = register_module("up", std::make_shared<nn::Linear>(d, h, true, opt));
    down = register_module("down", std::make_shared<nn::Linear>(h, d, true, opt));
  }
  Tensor operator()(const Tensor& x) {
    return call({x}, [this](const std::vector<Tensor>& in) { return (*down)(tanh((*up)(in[0]))); });
  }
  std::shared_ptr<nn::Linear> up, down;
};

struct Grads {
  Tensor x;
  std::vector<Tensor> params;
};

Grads run(Mlp& mlp, const Tensor& x_in, const Tensor& v, bool free_fn_checkpoint) {
  mlp.zero_grad();
  Tensor x = x_in.detach().clone().set_requires_grad(true);
  Tensor y;
  if (free_fn_checkpoint) {
    y = autograd::checkpoint([&mlp](const std::vector<Tensor>& in) { return mlp(in[0]); }, {x});
  } else {
    y = mlp(x);
  }
  sum(mul(y, v)).backward();
  Grads g{x.grad(), {}};
  for (const Tensor& p : mlp.parameters()) g.params.push_back(p.grad());
  return g;
}

void expect_same(const Grads& a, const Grads& b) {
  ASSERT_TRUE(a.x.defined() && b.x.defined());
  EXPECT_TRUE(all_close(a.x, b.x, 1e-12, 0));
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    ASSERT_TRUE(a.params[i].defined() && b.params[i].defined()) << i;
    EXPECT_TRUE(all_close(a.params[i], b.params[i], 1e-12, 0)) << i;
  }
}

TEST(ActivationCheckpoint, GradientsEqualWithoutCheckpointing) {
  Mlp mlp(5, 7, f64());
  mlp.init_weights(3);
  const Tensor x = randn64({4, 5}, 1, false), v = randn64({4, 5}, 2, false);
  const Grads plain = run(mlp, x, v, false);
  const Grads free_fn = run(mlp, x, v, true);
  expect_same(plain, free_fn);
  mlp.set_activation_checkpointing(true);
  const Grads module_ac = run(mlp, x, v, false);
  expect_same(plain, module_ac);
  // Forward values are the same too.
  const Tensor y_ac = mlp(x);
  mlp.set_activation_checkpointing(false);
  EXPECT_TRUE(all_close(y_ac, mlp(x), 0, 0));
}

TEST(ActivationCheckpoint, ParametersGetGradientsWhenInputsDoNotRequireGrad) {
  Mlp mlp(3, 4, f64());
  mlp.init_weights(1);
  const Tensor x = randn64({2, 3}, 4, false);
  sum(mlp(x)).backward();
  std::vector<Tensor> expected;
  for (const Tensor& p : mlp.parameters()) expected.push_back(p.grad().clone());
  mlp.zero_grad();
  mlp.set_activation_checkpointing(true);
  Tensor y = mlp(x);
  EXPECT_TRUE(y.requires_grad());
  sum(y).backward();
  const auto params = mlp.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(all_close(params[i].grad(), expected[i], 1e-12, 0)) << i;
}

TEST(ActivationCheckpoint, HooksOfTheCheckpointedModuleFireOnce) {
  Mlp mlp(3, 4, f64());
  mlp.set_activation_checkpointing(true);
  std::vector<std::string> log;
  mlp.register_forward_pre_hook([&](nn::Module&, std::vector<Tensor>&) { log.push_back("pre"); });
  mlp.register_forward_hook(
      [&](nn::Module&, const std::vector<Tensor>&, std::vector<Tensor>&) { log.push_back("fwd"); });
  mlp.register_backward_pre_hook([&](nn::Module&) { log.push_back("bwd_pre"); });
  mlp.register_backward_hook([&](nn::Module&) {
    EXPECT_TRUE(mlp.up->weight.grad().defined());
    log.push_back("bwd");
  });
  mlp.up->register_forward_hook([&](nn::Module&, const std::vector<Tensor>&, std::vector<Tensor>&) {
    log.push_back("up.fwd");
  });
  Tensor x = randn64({2, 3}, 1);
  sum(mlp(x)).backward();
  // The region (and so `up`) runs again inside the module's backward; the checkpointed
  // module's own hooks stay outside the region and fire once.
  EXPECT_EQ(log, (std::vector<std::string>{"pre", "up.fwd", "fwd", "bwd_pre", "up.fwd", "bwd"}));
}

TEST(ActivationCheckpoint, Gradcheck) {
  auto fn = [](const std::vector<Tensor>& in) {
    return autograd::checkpoint(
        [](const std::vector<Tensor>& t) { return mul(tanh(mul(t[0], t[1])), t[0]); }, in);
  };
  const auto r = autograd::gradcheck(fn, {randn64({3, 4}, 1), randn64({4}, 2)});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(ActivationCheckpoint, InPlaceChangeOfSavedInputThrows) {
  Tensor w = randn64({3}, 1);
  Tensor x = randn64({3}, 2, false);
  Tensor y =
      autograd::checkpoint([w](const std::vector<Tensor>& in) { return mul(in[0], w); }, {x});
  x.fill_(1.0);
  try {
    sum(y).backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

TEST(ActivationCheckpoint, UnderNoGradJustRuns) {
  NoGradGuard no_grad;
  Tensor x = randn64({3}, 2, false);
  Tensor y =
      autograd::checkpoint([](const std::vector<Tensor>& in) { return mul(in[0], 2.0); }, {x});
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(all_close(y, mul(x, 2.0), 0, 0));
}

// A deeper stack: peak memory of forward + backward is lower with checkpointing.
int64_t peak_bytes(bool checkpointing) {
  constexpr int kLayers = 12;
  std::vector<std::shared_ptr<Mlp>> layers;
  for (int i = 0; i < kLayers; ++i) {
    layers.push_back(std::make_shared<Mlp>(32, 256, TensorOptions{}));
    layers.back()->set_activation_checkpointing(checkpointing);
  }
  const Tensor x = randn({1024, 32}, RandomKey(1, "x"), TensorOptions{}.with_requires_grad(true));
  reset_peak_memory(Device::cpu());
  const int64_t base = memory_stats(Device::cpu()).bytes_in_use;
  Tensor h = x;
  for (auto& l : layers) h = (*l)(h);
  sum(h).backward();
  return memory_stats(Device::cpu()).peak_bytes_in_use - base;
}

TEST(ActivationCheckpoint, PhaseSaysForwardThenRecompute) {
  using autograd::CheckpointPhase;
  std::vector<CheckpointPhase> outer_seen, inner_seen;
  auto inner = [&](const std::vector<Tensor>& in) {
    inner_seen.push_back(autograd::checkpoint_phase());
    return mul(in[0], in[0]);
  };
  auto outer = [&](const std::vector<Tensor>& in) {
    outer_seen.push_back(autograd::checkpoint_phase());
    return autograd::checkpoint(inner, {tanh(in[0])});
  };
  EXPECT_EQ(autograd::checkpoint_phase(), CheckpointPhase::None);
  Tensor x = randn64({3}, 7);
  Tensor y = autograd::checkpoint(outer, {x});
  EXPECT_EQ(outer_seen, std::vector<CheckpointPhase>{CheckpointPhase::Forward});
  EXPECT_EQ(inner_seen, std::vector<CheckpointPhase>{CheckpointPhase::Forward});
  sum(y).backward();
  // The outer recompute runs the inner region's forward (still a recompute), then the inner
  // region recomputes itself.
  EXPECT_EQ(outer_seen,
            (std::vector<CheckpointPhase>{CheckpointPhase::Forward, CheckpointPhase::Recompute}));
  EXPECT_EQ(inner_seen,
            (std::vector<CheckpointPhase>{CheckpointPhase::Forward, CheckpointPhase::Recompute,
                                          CheckpointPhase::Recompute}));
  EXPECT_EQ(autograd::checkpoint_phase(), CheckpointPhase::None);
  // Under no_grad the region just runs: no phase.
  NoGradGuard no_grad;
  outer_seen.clear();
  autograd::checkpoint(outer, {x});
  EXPECT_EQ(outer_seen, std::vector<CheckpointPhase>{CheckpointPhase::None});
}

TEST(ActivationCheckpoint, LowersPeakMemory) {
  const int64_t plain = peak_bytes(false);
  const int64_t ac = peak_bytes(true);
  // Without checkpointing each layer keeps [1024, 256] activations (pre- and post-tanh);
  // with it only each layer's [1024, 32] input is kept (parameter gradients are in both).
  EXPECT_LT(ac, plain) << "checkpointed peak " << ac << " bytes vs " << plain;
  EXPECT_LT(double(ac), 0.5 * double(plain)) << "checkpointed peak " << ac << " vs " << plain;
}

}  // namespace
}  // namespace mt::runtime
