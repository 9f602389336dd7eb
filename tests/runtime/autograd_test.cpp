// The autograd engine: accumulation, ordering, hooks, grad mode, saved-tensor safety, and the
// gradcheck utility itself (it must catch a wrong gradient).
#include <gtest/gtest.h>

#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/gradcheck.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::randn64;

TensorOptions f64_grad() { return TensorOptions{}.with_dtype(DType::F64).with_requires_grad(true); }

TEST(Autograd, DiamondGraphAccumulatesBothPaths) {
  Tensor x = from_vector<double>({1, 2, 3}, {3}, f64_grad());
  Tensor y = mul(x, x);         // dy/dx = 2x
  Tensor z = add(y, mul(x, 3.0));  // + 3
  sum(z).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5, 7, 9}));
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(z.is_leaf());
  EXPECT_EQ(z.grad_fn()->name(), "add");
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = from_vector<double>({1, 2}, {2}, f64_grad());
  sum(mul(x, 2.0)).backward();
  sum(mul(x, 2.0)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{4, 4}));
}

TEST(Autograd, LongChainRunsWithoutRecursion) {
  Tensor x = from_vector<double>({1}, {1}, f64_grad());
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = add(y, 1.0);
  sum(y).backward();  // a recursive walk would overflow the stack here
  EXPECT_EQ(x.grad().item<double>(), 1.0);
  // Dropping a 100k-node graph that was never run backward must not recurse either.
  Tensor z = x;
  for (int i = 0; i < 100000; ++i) z = add(z, 1.0);
  z = Tensor();
}

TEST(Autograd, NoGradAndDetachRecordNothing) {
  Tensor x = from_vector<double>({1, 2}, {2}, f64_grad());
  {
    NoGradGuard guard;
    EXPECT_FALSE(mul(x, 2.0).requires_grad());
  }
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.shares_storage_with(x));
  EXPECT_TRUE(mul(x, 2.0).requires_grad());
  EXPECT_THROW(sum(mul(d, 2.0)).backward(), Error);  // nothing requires grad
}

TEST(Autograd, TensorHooksSeeAndReplaceGradients) {
  Tensor x = from_vector<double>({1, 2}, {2}, f64_grad());
  Tensor y = mul(x, 3.0);
  std::vector<double> seen;
  y.register_hook([&](const Tensor& g) {
    seen = g.to_vector<double>();
    return mul(g, 10.0);  // replaces the gradient flowing on
  });
  int leaf_hooks = 0, post_hooks = 0;
  x.register_hook([&](const Tensor& g) {
    ++leaf_hooks;
    return Tensor();  // keep
  });
  x.register_post_accumulate_grad_hook([&](const Tensor& leaf) {
    ++post_hooks;
    EXPECT_EQ(leaf.grad().to_vector<double>(), (std::vector<double>{30, 30}));
  });
  sum(y).backward();
  EXPECT_EQ(seen, (std::vector<double>{1, 1}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{30, 30}));
  EXPECT_EQ(leaf_hooks, 1);
  EXPECT_EQ(post_hooks, 1);
}

TEST(Autograd, BackwardTwiceNeedsRetainGraph) {
  Tensor x = from_vector<double>({2}, {1}, f64_grad());
  Tensor y = sum(mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_EQ(x.grad().item<double>(), 8.0);
  Tensor z = sum(mul(x, x));
  z.backward();
  EXPECT_THROW(z.backward(), Error);
}

TEST(Autograd, ModifyingASavedTensorInPlaceIsAnError) {
  Tensor x = from_vector<double>({1, 2}, {2}, f64_grad());
  Tensor w = from_vector<double>({3, 4}, {2}, TensorOptions{}.with_dtype(DType::F64));
  Tensor y = sum(mul(x, w));  // saves w
  w.fill_(0);
  try {
    y.backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

TEST(Autograd, InPlaceOnATensorThatRequiresGradIsRefused) {
  Tensor x = from_vector<double>({1, 2}, {2}, f64_grad());
  EXPECT_THROW(x.fill_(0), Error);
  NoGradGuard guard;  // what optimizers do
  EXPECT_NO_THROW(x.fill_(0));
}

TEST(Autograd, MultipleRootsAndNonScalarRootNeedsGradient) {
  Tensor x = from_vector<double>({1, 2}, {2}, f64_grad());
  Tensor a = mul(x, 2.0), b = mul(x, 5.0);
  autograd::backward({a, b}, {ones({2}, TensorOptions{}.with_dtype(DType::F64)),
                              full({2}, 2.0, TensorOptions{}.with_dtype(DType::F64))});
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{12, 12}));
  EXPECT_THROW(mul(x, 2.0).backward(), Error);  // non-scalar root without a gradient
}

TEST(Autograd, QueuedCallbacksRunAfterTheWalk) {
  Tensor x = from_vector<double>({1}, {1}, f64_grad());
  std::vector<std::string> order;
  Tensor y = mul(x, 2.0);
  y.register_hook([&](const Tensor&) {
    order.push_back("hook");
    autograd::queue_callback([&] {
      order.push_back("callback");
      EXPECT_TRUE(x.grad().defined());  // leaves are done when callbacks run
    });
    return Tensor();
  });
  sum(y).backward();
  EXPECT_EQ(order, (std::vector<std::string>{"hook", "callback"}));
  EXPECT_THROW(autograd::queue_callback([] {}), Error);
}

TEST(Autograd, LeafGradientIsCompleteBeforeLaterNodesRun) {
  Tensor x = from_vector<double>({1}, {1}, f64_grad());
  Tensor w = from_vector<double>({1}, {1}, f64_grad());
  Tensor old_graph = mul(x, 1.0);  // creates x's AccumulateGrad early (low sequence number)
  Tensor v = mul(w, 1.0);
  Tensor q = mul(v, 3.0);
  Tensor p = mul(x, 2.0);  // runs first; then x's old sink and q's node are ready together
  bool x_grad_ready_when_v_ran = false;
  v.register_hook([&](const Tensor&) {
    x_grad_ready_when_v_ran = x.grad().defined();
    return Tensor();
  });
  sum(add(p, q)).backward();
  EXPECT_TRUE(x_grad_ready_when_v_ran);
}

TEST(Autograd, CallbacksQueuedInANestedBackwardRunAfterTheOuterOne) {
  Tensor x = from_vector<double>({1}, {1}, f64_grad());
  Tensor inner_leaf = from_vector<double>({1}, {1}, f64_grad());
  std::vector<std::string> order;
  Tensor y = mul(x, 2.0);
  y.register_hook([&](const Tensor&) {
    EnableGradGuard grad;  // hooks run under no_grad
    Tensor z = mul(inner_leaf, 3.0);
    z.register_hook([&](const Tensor&) {
      autograd::queue_callback([&] { order.push_back("inner-callback"); });
      return Tensor();
    });
    sum(z).backward();  // nested, as activation checkpointing's recompute does
    order.push_back("after-nested");
    return Tensor();
  });
  sum(y).backward();
  EXPECT_EQ(order, (std::vector<std::string>{"after-nested", "inner-callback"}));
}

TEST(Autograd, UnusedOutputsOfMultiOutputNodesGetZeros) {
  // A node with two outputs where only one reaches the loss.
  Tensor x = from_vector<double>({1, 2}, {2}, f64_grad());
  Tensor a = empty({2}, TensorOptions{}.with_dtype(DType::F64)), b = empty_like(a);
  a.copy_(x.detach());
  b.copy_(x.detach());
  autograd::record("two_outputs", {x}, {a, b}, [](const autograd::BackwardArgs& args) {
    return std::vector<Tensor>{add(mul(args.grad(0), 2.0), mul(args.grad(1), 3.0))};
  });
  sum(a).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 2}));
}

TEST(Autograd, ViewsBackpropagate) {
  Tensor x = randn64({3, 4}, 1);
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        const Tensor& t = in[0];
        Tensor a = t.t().narrow(0, 1, 2).reshape({6}).unsqueeze(0).expand({2, 6});
        Tensor b = t.slice(1, 0, 4, 2).permute({1, 0}).reshape({6}).select(0, 4);
        return add(a.contiguous(), mul(b, sum(t.select(1, 3).squeeze())));
      },
      {x});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Autograd, CastsAndClonesBackpropagate) {
  Tensor x = randn64({2, 3}, 3);
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return mul(in[0].to(DType::F32).to(DType::F64), in[0].clone().transpose(0, 1).t());
      },
      {x}, {.eps = 1e-3, .atol = 1e-3, .rtol = 1e-3});  // the f32 round trip limits accuracy
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Autograd, GradcheckCatchesAWrongGradient) {
  Tensor x = randn64({4}, 2);
  auto wrong = [](const std::vector<Tensor>& in) {
    Tensor out = empty({4}, TensorOptions{}.with_dtype(DType::F64));
    out.copy_(mul(in[0].detach(), in[0].detach()));
    autograd::record("wrong_square", {in[0]}, {out},
                     [saved = autograd::SavedTensor(in[0])](const autograd::BackwardArgs& args) {
                       return std::vector<Tensor>{mul(args.grad(0), saved.get())};  // misses 2x
                     });
    return out;
  };
  EXPECT_FALSE(autograd::gradcheck(wrong, {x}).ok);
}

}  // namespace
}  // namespace mt::runtime
