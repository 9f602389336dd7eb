// The split backward (runtime/autograd/engine.h): backward_input then backward_weight give the
// gradients of one backward bitwise, with the inputs' gradients ready after the first pass and
// the weights' only after the second, and each op's backward asked for the right edges in each.
#include <gtest/gtest.h>

#include <vector>

#include "runtime/autograd/checkpoint.h"
#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime::autograd {
namespace {

using testing::all_close;

struct Leaves {
  Tensor x, w1, w2, w3;
};

Leaves make_leaves() {
  Leaves l;
  l.x = testing::randn_as({4, 8}, DType::F32, 1, "x").set_requires_grad(true);
  l.w1 = testing::randn_as({8, 16}, DType::F32, 2, "w1").set_requires_grad(true);
  l.w2 = testing::randn_as({16, 8}, DType::F32, 3, "w2").set_requires_grad(true);
  l.w3 = testing::randn_as({8}, DType::F32, 4, "w3").set_requires_grad(true);
  return l;
}

// A two-layer MLP with a residual and an elementwise weight: every kind of edge (input side,
// weight side, both from one node).
Tensor mlp(const Leaves& l, bool checkpointed = false) {
  auto block = [l](const std::vector<Tensor>& in) {
    return add(matmul(silu(matmul(in[0], l.w1)), l.w2), in[0]);
  };
  Tensor h = checkpointed ? checkpoint(block, {l.x}) : block({l.x});
  return sum(square(mul(h, l.w3)));
}

void expect_same_grads(const Leaves& got, const Leaves& want) {
  EXPECT_TRUE(all_close(got.x.grad(), want.x.grad(), 0, 0));
  EXPECT_TRUE(all_close(got.w1.grad(), want.w1.grad(), 0, 0));
  EXPECT_TRUE(all_close(got.w2.grad(), want.w2.grad(), 0, 0));
  EXPECT_TRUE(all_close(got.w3.grad(), want.w3.grad(), 0, 0));
}

TEST(SplitBackward, InputPassThenWeightPassEqualOneBackwardBitwise) {
  for (bool checkpointed : {false, true}) {
    SCOPED_TRACE(checkpointed ? "checkpointed block" : "plain");
    const Leaves whole = make_leaves();
    mlp(whole, checkpointed).backward();

    const Leaves split = make_leaves();
    DeferredBackward deferred = backward_input({mlp(split, checkpointed)}, {}, {split.x});
    ASSERT_TRUE(split.x.grad().defined());
    EXPECT_TRUE(all_close(split.x.grad(), whole.x.grad(), 0, 0));
    EXPECT_FALSE(split.w3.grad().defined());  // weight work waits
    if (!checkpointed) {  // a recomputed region runs whole in the input pass
      EXPECT_FALSE(split.w1.grad().defined());
      EXPECT_FALSE(split.w2.grad().defined());
    }
    EXPECT_FALSE(deferred.empty());
    backward_weight(std::move(deferred));
    expect_same_grads(split, whole);
  }
}

// A root the inputs do not depend on is all weight work; gradients accumulate over two split
// backwards as over two whole ones.
TEST(SplitBackward, AccumulatesAndHandlesRootsBesideTheInputs) {
  const Leaves whole = make_leaves();
  for (int i = 0; i < 2; ++i) backward({mlp(whole), sum(square(whole.w3))});
  const Leaves split = make_leaves();
  for (int i = 0; i < 2; ++i) {
    DeferredBackward d = backward_input({mlp(split), sum(square(split.w3))}, {}, {split.x});
    backward_weight(std::move(d));
  }
  expect_same_grads(split, whole);
}

// An op's backward is asked for its input-side edge in the first pass and its weight-side edge
// in the second, never both at once.
TEST(SplitBackward, OpsAreAskedForOneSideAtATime) {
  const Leaves l = make_leaves();
  std::vector<std::pair<bool, bool>> asked;  // (needs x, needs w) per call
  Tensor out = Tensor::empty({4, 8}, TensorOptions{}.with_dtype(DType::F32));
  out.copy_(l.x);
  record("probe", {l.x, l.w3}, {out}, [&asked](const BackwardArgs& args) {
    asked.emplace_back(args.needs(0), args.needs(1));
    return std::vector<Tensor>{args.needs(0) ? args.grad(0) : Tensor(),
                               args.needs(1) ? sum(args.grad(0), {0}) : Tensor()};
  });
  DeferredBackward d = backward_input({sum(out)}, {}, {l.x});
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], std::make_pair(true, false));
  backward_weight(std::move(d));
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[1], std::make_pair(false, true));
  EXPECT_TRUE(l.w3.grad().defined());
}

TEST(SplitBackward, InputsMustBeLeavesThatRequireGrad) {
  const Leaves l = make_leaves();
  const Tensor loss = mlp(l);
  EXPECT_THROW(backward_input({loss}, {}, {matmul(l.x, l.w1)}), Error);
}

}  // namespace
}  // namespace mt::runtime::autograd
