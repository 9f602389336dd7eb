// Op-level selective checkpointing (runtime/autograd/selective_checkpoint.h): the recompute reuses
// the outputs the policy kept and runs the rest, with the plain gradients; kept outputs changed
// in place are recomputed; a recompute that differs from the forward is refused; regions nested
// in a selective one do not shift its counts; the kept outputs lower memory less than none.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/autograd/checkpoint.h"
#include "runtime/core/allocator.h"
#include "runtime/core/grad_mode.h"
#include "runtime/core/profiler.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using autograd::CheckpointPhase;
using testing::all_close;
using testing::randn64;

// Keeps every matmul output (or none).
autograd::SavePolicy keep_matmuls(bool keep = true) {
  return [keep](const std::string& op, int64_t) { return keep && op == "matmul"; };
}

// Matmul kernels that `run` dispatches on this thread.
template <class Fn>
int64_t matmuls_in(Fn&& run) {
  Profiler::start(Device::cpu());
  run();
  int64_t n = 0;
  for (const ProfiledOp& op : Profiler::stop().ops)
    n += op.depth == 0 && std::string(op.name) == "matmul";
  return n;
}

void clear_grads(const std::vector<Tensor>& leaves) {
  for (const Tensor& t : leaves) t.set_grad(Tensor());
}

struct Weights {
  Tensor w1 = randn64({4, 6}, 11), w2 = randn64({6, 3}, 12);
};

// x -> tanh(x w1) w2 -> tanh: two matmuls whose outputs feed tanh (whose backward reads its
// output, so a wrong reused value changes the gradients).
Tensor two_layers(const Tensor& x, const Weights& w) {
  return tanh(matmul(tanh(matmul(x, w.w1)), w.w2));
}

struct Grads {
  Tensor x, w1, w2;
};
Grads grads_of(const Tensor& x, const Weights& w) {
  return {x.grad().clone(), w.w1.grad().clone(), w.w2.grad().clone()};
}
void expect_same(const Grads& a, const Grads& b) {
  EXPECT_TRUE(all_close(a.x, b.x, 0, 0));
  EXPECT_TRUE(all_close(a.w1, b.w1, 0, 0));
  EXPECT_TRUE(all_close(a.w2, b.w2, 0, 0));
}

TEST(SelectiveCheckpoint, ReusesTheKeptOutputsWithThePlainGradients) {
  const Weights w;
  const Tensor v = randn64({5, 3}, 2, false);
  Tensor x = randn64({5, 4}, 1);
  sum(mul(two_layers(x, w), v)).backward();
  const Grads plain = grads_of(x, w);
  int64_t plain_backward = 0;
  {
    clear_grads({x, w.w1, w.w2});
    Tensor y = two_layers(x, w);
    plain_backward = matmuls_in([&] { sum(mul(y, v)).backward(); });
  }
  struct Case {
    autograd::SavePolicy policy;
    int64_t recomputed;
  };
  const std::vector<Case> cases = {
      {nullptr, 2},
      {keep_matmuls(false), 2},
      {keep_matmuls(), 0},
      {[](const std::string& op, int64_t nth) { return op == "matmul" && nth == 1; }, 1},
      {autograd::matmul_and_attention_policy(), 1}};  // keeps the 1st
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    clear_grads({x, w.w1, w.w2});
    Tensor y = autograd::checkpoint(
        [&w](const std::vector<Tensor>& in) { return two_layers(in[0], w); }, {x},
        cases[i].policy);
    EXPECT_EQ(matmuls_in([&] { sum(mul(y, v)).backward(); }) - plain_backward,
              cases[i].recomputed);
    expect_same(grads_of(x, w), plain);
  }
}

TEST(SelectiveCheckpoint, AKeptOutputChangedInPlaceIsRecomputed) {
  const Weights w;
  const Tensor v = randn64({5, 6}, 2, false);
  Tensor x = randn64({5, 4}, 1);
  // The region returns the matmul's output itself and the tanh of it.
  const auto region = [&w](const std::vector<Tensor>& in) {
    Tensor h = matmul(in[0], w.w1);
    return std::vector<Tensor>{h, tanh(h)};
  };
  const auto loss = [&v](const std::vector<Tensor>& out) { return sum(mul(out[1], v)); };
  loss(region({x})).backward();
  const Tensor plain_dx = x.grad().clone(), plain_dw1 = w.w1.grad().clone();

  for (const bool change : {false, true}) {
    SCOPED_TRACE(change);
    clear_grads({x, w.w1});
    std::vector<Tensor> out = autograd::checkpoint_multi(region, {x}, keep_matmuls());
    if (change) {
      NoGradGuard no_grad;
      add_(out[0], 1.0);  // the same storage as the kept output
    }
    Tensor l = loss(out);
    // The matmul's own gradient takes 2 matmuls; reusing the output saves the third.
    EXPECT_EQ(matmuls_in([&] { l.backward(); }), change ? 3 : 2);
    EXPECT_TRUE(all_close(x.grad(), plain_dx, 0, 0));
    EXPECT_TRUE(all_close(w.w1.grad(), plain_dw1, 0, 0));
  }
}

TEST(SelectiveCheckpoint, ARecomputeThatDiffersFromTheForwardThrows) {
  const Weights w;
  Tensor x = randn64({5, 4}, 1);
  Tensor y = autograd::checkpoint(
      [&w](const std::vector<Tensor>& in) {
        // Not deterministic: the recompute multiplies fewer rows.
        const bool again = autograd::checkpoint_phase() == CheckpointPhase::Recompute;
        return sum(matmul(again ? in[0].narrow(0, 0, 2) : in[0], w.w1));
      },
      {x}, keep_matmuls());
  const std::string m = testing::error_of([&] { y.backward(); });
  EXPECT_NE(m.find("call 0 of matmul in the recompute takes f64[2, 4] f64[4, 6]"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("the forward's took f64[5, 4] f64[4, 6]"), std::string::npos) << m;
}

// The outer region's forward runs under no_grad, so the inner region just runs there; in the
// outer recompute (grad on) it records itself. Neither run counts the inner matmul against the
// outer policy, so the outer's own matmul is the same call in both.
TEST(SelectiveCheckpoint, NestedRegionsDoNotShiftTheCounts) {
  const Weights w;
  const Tensor w3 = randn64({4, 4}, 13);
  const Tensor v = randn64({5, 6}, 2, false);
  Tensor x = randn64({5, 4}, 1);
  const auto inner = [&w3](const std::vector<Tensor>& in) { return tanh(matmul(in[0], w3)); };
  const auto body = [&](const std::vector<Tensor>& in, bool checkpointed) {
    Tensor h = checkpointed ? autograd::checkpoint(inner, in) : inner(in);
    return tanh(matmul(h, w.w1));  // the outer's matmul 0
  };
  sum(mul(body({x}, false), v)).backward();
  const Tensor plain_dx = x.grad().clone(), plain_dw1 = w.w1.grad().clone();
  clear_grads({x, w.w1, w3});

  const auto keep_first = [](const std::string& op, int64_t nth) {
    return op == "matmul" && nth == 0;
  };
  Tensor y = autograd::checkpoint(
      [&](const std::vector<Tensor>& in) { return body(in, true); }, {x}, keep_first);
  sum(mul(y, v)).backward();
  EXPECT_TRUE(all_close(x.grad(), plain_dx, 0, 0));
  EXPECT_TRUE(all_close(w.w1.grad(), plain_dw1, 0, 0));
}

// A stack of regions a = x up, c = a * tanh(a), tanh(c down): without checkpointing each keeps a
// and tanh(a) ([1024, 256] each, for mul's backward), by op only a (plus the recompute's
// tensors during backward), fully checkpointed neither.
int64_t peak_bytes(bool checkpointing, const autograd::SavePolicy& policy) {
  constexpr int kLayers = 8;
  std::vector<Tensor> up, down;
  for (int i = 0; i < kLayers; ++i) {
    up.push_back(randn({32, 256}, RandomKey(2, "up", i), TensorOptions{}.with_requires_grad(true)));
    down.push_back(
        randn({256, 32}, RandomKey(2, "down", i), TensorOptions{}.with_requires_grad(true)));
  }
  const Tensor x = randn({1024, 32}, RandomKey(1, "x"), TensorOptions{}.with_requires_grad(true));
  reset_peak_memory(Device::cpu());
  const int64_t base = memory_stats(Device::cpu()).bytes_in_use;
  Tensor h = x;
  for (int i = 0; i < kLayers; ++i) {
    const auto layer = [&, i](const std::vector<Tensor>& in) {
      const Tensor a = matmul(in[0], up[i]);
      return tanh(matmul(mul(a, tanh(a)), down[i]));
    };
    h = checkpointing ? autograd::checkpoint(layer, {h}, policy) : layer({h});
  }
  sum(h).backward();
  return memory_stats(Device::cpu()).peak_bytes_in_use - base;
}

TEST(SelectiveCheckpoint, PeakMemoryLiesBetweenNoneAndFull) {
  const int64_t none = peak_bytes(false, nullptr);
  const int64_t full = peak_bytes(true, nullptr);
  const int64_t by_op = peak_bytes(true, [](const std::string& op, int64_t nth) {
    return op == "matmul" && nth == 0;
  });
  EXPECT_LT(full, by_op);
  EXPECT_LT(by_op, none);
}

}  // namespace
}  // namespace mt::runtime
