// Optimizers: AdamW and SGD against hand-written reference loops, skipping of parameters without
// gradients, state dtype, state_dict round trip and errors, thread-count independence.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/sgd.h"
#include "tests/runtime/grad_scale_check.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime::optim {
namespace {

using testing::all_close;

TensorOptions opts(DType d) { return TensorOptions{}.with_dtype(d); }

Tensor param_of(const std::vector<double>& v, DType d = DType::F64) {
  Tensor p = from_vector<double>(v, {int64_t(v.size())}, opts(d));
  p.set_requires_grad(true);
  return p;
}

// The gradient of step k (1-based) for element i.
double grad_at(int k, size_t i) { return std::sin(1.0 + 0.7 * k + 1.3 * double(i)) * (k + 1); }

void set_grad_for_step(const Tensor& p, int k) {
  std::vector<double> g(size_t(p.numel()));
  for (size_t i = 0; i < g.size(); ++i) g[i] = grad_at(k, i);
  p.set_grad(from_vector<double>(g, p.shape(), opts(p.dtype())));
}

TEST(AdamW, MatchesReferenceForThreeSteps) {
  const std::vector<double> init{0.5, -1.25, 2.0, 0.0, 3.5};
  const double lr = 0.01, b1 = 0.8, b2 = 0.95, eps = 1e-6, wd = 0.1;
  for (DType dtype : {DType::F64, DType::F32}) {
    Tensor p = param_of(init, dtype);
    AdamW opt({{"w", p}}, AdamWOptions{lr, b1, b2, eps, wd});
    std::vector<double> ref = init, m(init.size(), 0.0), v(init.size(), 0.0);
    for (int k = 1; k <= 3; ++k) {
      set_grad_for_step(p, k);
      opt.step();
      for (size_t i = 0; i < ref.size(); ++i) {
        const double g = grad_at(k, i);
        ref[i] -= lr * wd * ref[i];
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        const double mhat = m[i] / (1 - std::pow(b1, k)), vhat = v[i] / (1 - std::pow(b2, k));
        ref[i] -= lr * mhat / (std::sqrt(vhat) + eps);
      }
      const double tol = dtype == DType::F64 ? 1e-14 : 1e-6;
      const auto got = p.to_vector<double>();
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_NEAR(got[i], ref[i], tol * (1 + std::abs(ref[i])))
            << dtype << " step " << k << " i " << i;
      const ParamState& st = opt.state(0, 0);
      EXPECT_EQ(st.step, k);
      const auto mv = st.tensors[0].to_vector<double>(), vv = st.tensors[1].to_vector<double>();
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_NEAR(mv[i], m[i], tol * (1 + std::abs(m[i])));
        EXPECT_NEAR(vv[i], v[i], tol * (1 + std::abs(v[i])));
      }
    }
    EXPECT_EQ(opt.state(0, 0).tensors[0].dtype(), dtype);  // f64 state for f64, f32 for f32
  }
}

// bf16 parameters keep f32 moments; each step runs in f32 on the widened parameter and rounds it
// to bf16 once (the CPU kernel's vectorised loop and its remainder: 1037 elements). Against an f64
// reference that rounds the parameter to bf16 after each step: the parameter within one bf16 ulp
// (the f32 update may round the other way near a tie), the moments to f32 precision.
TEST(AdamW, Bf16ParamsKeepF32State) {
  const size_t n = 1037;
  std::vector<double> init(n);
  for (size_t i = 0; i < n; ++i) init[i] = double(bfloat16(float(std::cos(0.37 * double(i)) * 3)));
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  Tensor p = param_of(init, DType::BF16);
  AdamW opt(std::vector<Tensor>{p}, AdamWOptions{lr, b1, b2, eps, wd});
  std::vector<double> ref = init, m(n, 0.0), v(n, 0.0);
  for (int k = 1; k <= 3; ++k) {
    set_grad_for_step(p, k);
    const auto g = p.grad().to_vector<double>();  // the bf16 gradient's values
    opt.step();
    for (size_t i = 0; i < n; ++i) {
      double r = ref[i] * (1 - lr * wd);
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(b1, k)), vhat = v[i] / (1 - std::pow(b2, k));
      ref[i] = double(bfloat16(float(r - lr * mhat / (std::sqrt(vhat) + eps))));
    }
    const auto got = p.to_vector<double>();
    const auto mv = opt.state(0, 0).tensors[0].to_vector<double>();
    const auto vv = opt.state(0, 0).tensors[1].to_vector<double>();
    for (size_t i = 0; i < n; ++i) {
      EXPECT_LE(std::abs(got[i] - ref[i]), std::ldexp(std::abs(ref[i]), -7)) << k << " " << i;
      EXPECT_NEAR(mv[i], m[i], 1e-6 * (1 + std::abs(m[i]))) << k << " " << i;
      EXPECT_NEAR(vv[i], v[i], 1e-6 * (1 + std::abs(v[i]))) << k << " " << i;
    }
  }
  EXPECT_EQ(opt.state(0, 0).tensors[0].dtype(), DType::F32);
  EXPECT_EQ(opt.state(0, 0).tensors[1].dtype(), DType::F32);
  EXPECT_EQ(p.dtype(), DType::BF16);
}

TEST(AdamW, SkipsParamsWithoutGradAndBumpsVersions) {
  Tensor a = param_of({1.0, 2.0}), b = param_of({3.0});
  AdamW opt({{"a", a}, {"b", b}});
  set_grad_for_step(a, 1);
  const uint64_t va = a.version(), vb = b.version();
  opt.step();
  EXPECT_GT(a.version(), va);
  EXPECT_EQ(b.version(), vb);
  EXPECT_EQ(b.item<double>(), 3.0);
  EXPECT_TRUE(opt.state(0, 0).initialized);
  EXPECT_FALSE(opt.state(0, 1).initialized);
  const StateDict sd = opt.state_dict();
  EXPECT_TRUE(sd.contains("state.a.exp_avg"));
  EXPECT_TRUE(sd.contains("state.a.exp_avg_sq"));
  EXPECT_EQ(sd.at("state.a.step").item<int64_t>(), 1);
  EXPECT_FALSE(sd.contains("state.b.step"));
  EXPECT_EQ(sd.at("param_groups.0.lr").item<double>(), 1e-3);
  EXPECT_EQ(sd.at("param_groups.0.weight_decay").item<double>(), 1e-2);
}

TEST(AdamW, ParameterGroupsUseTheirOwnHyperparameters) {
  Tensor a = param_of({1.0}), b = param_of({1.0});
  ParamGroup ga = make_group({{"a", a}}), gb = make_group({{"b", b}});
  ga.lr = 0.1;
  gb.lr = 0.0;
  AdamW opt({ga, gb});
  set_grad_for_step(a, 1);
  set_grad_for_step(b, 1);
  opt.step();
  EXPECT_NEAR(a.item<double>(), 1.0 - 0.1, 1e-6);
  EXPECT_EQ(b.item<double>(), 1.0);
  opt.set_lr(0.5);
  EXPECT_EQ(opt.lr(0), 0.5);
  EXPECT_EQ(opt.lr(1), 0.5);
  EXPECT_THROW(opt.lr(2), Error);
}

TEST(AdamW, StateDictRoundTripResumesExactly) {
  Tensor a = param_of({0.3, -0.7, 1.1}), b = param_of({2.0, 4.0});
  AdamW opt({{"layers.0.w", a}, {"layers.1.w", b}}, AdamWOptions{0.05, 0.9, 0.99, 1e-8, 0.01});
  for (int k = 1; k <= 2; ++k) {
    set_grad_for_step(a, k);
    set_grad_for_step(b, k);
    opt.step();
  }
  // A second optimizer on copies of the parameters, with other hyper-parameters, loads the state.
  Tensor a2 = a.detach().clone().set_requires_grad(true);
  Tensor b2 = b.detach().clone().set_requires_grad(true);
  AdamW opt2({{"layers.0.w", a2}, {"layers.1.w", b2}}, AdamWOptions{1.0, 0.5, 0.5, 1.0, 0.0});
  opt2.load_state_dict(opt.state_dict());
  EXPECT_EQ(opt2.lr(), 0.05);
  EXPECT_EQ(opt2.state(0, 1).step, 2);
  // Loaded state is a copy, not shared with opt.
  EXPECT_FALSE(opt2.state(0, 0).tensors[0].shares_storage_with(opt.state(0, 0).tensors[0]));
  for (int k = 3; k <= 4; ++k) {
    for (const Tensor& p : {a, b, a2, b2}) set_grad_for_step(p, k);
    opt.step();
    opt2.step();
  }
  EXPECT_TRUE(all_close(a2, a, 0, 0));
  EXPECT_TRUE(all_close(b2, b, 0, 0));
}

TEST(AdamW, LoadStateDictErrors) {
  Tensor a = param_of({0.3, -0.7, 1.1});
  AdamW opt({{"w", a}});
  set_grad_for_step(a, 1);
  opt.step();
  StateDict sd = opt.state_dict();

  StateDict missing = sd;
  missing.erase("state.w.exp_avg_sq");
  missing.insert("state.v.exp_avg", zeros({3}, opts(DType::F64)));
  try {
    opt.load_state_dict(missing);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("missing keys: 'state.w.exp_avg_sq'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected keys: 'state.v.exp_avg'"), std::string::npos) << msg;
  }
  StateDict shape = sd;
  shape.set("state.w.exp_avg", zeros({4}, opts(DType::F64)));
  try {
    opt.load_state_dict(shape);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'state.w.exp_avg': expected shape [3] f64, found shape [4] f64"),
              std::string::npos)
        << msg;
  }
  StateDict group = sd;
  group.erase("param_groups.0.lr");
  EXPECT_THROW(opt.load_state_dict(group), Error);
  // A failed load leaves the optimizer untouched.
  EXPECT_EQ(opt.state(0, 0).step, 1);
}

TEST(AdamW, ConstructionErrors) {
  Tensor a = param_of({1.0});
  EXPECT_THROW(AdamW(std::vector<Tensor>{a, a}), Error);
  EXPECT_THROW(AdamW({{"x", a}, {"x", param_of({1.0})}}), Error);
  EXPECT_THROW(AdamW(std::vector<Tensor>{a}, AdamWOptions{-1.0}), Error);
  EXPECT_THROW(AdamW(std::vector<Tensor>{a}, AdamWOptions{0.1, 1.0}), Error);
  Tensor ids = arange(3);
  EXPECT_THROW(AdamW(std::vector<Tensor>{ids}), Error);
  try {
    AdamW(std::vector<Tensor>{a}, AdamWOptions{0.1, 0.9, 1.5});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("beta2 must be in [0, 1), got 1.5"), std::string::npos)
        << e.what();
  }
}

TEST(AdamW, ResultsDoNotDependOnThreadCount) {
  const int64_t n = 200003;
  std::vector<Tensor> results;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Tensor p = randn({n}, RandomKey(1, "p"));
    p.set_requires_grad(true);
    AdamW opt(std::vector<Tensor>{p}, AdamWOptions{0.01});
    for (int k = 0; k < 2; ++k) {
      p.set_grad(randn({n}, RandomKey(2, "g", uint64_t(k))));
      opt.step();
    }
    results.push_back(p);
  }
  omp_set_num_threads(2);
  EXPECT_TRUE(all_close(results[0], results[1], 0, 0));
}

TEST(SGD, MomentumMatchesReferenceForThreeSteps) {
  const std::vector<double> init{0.5, -1.25, 2.0};
  struct Case {
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (Case c : {Case{0.9, 0.0, 0.0, false}, Case{0.9, 0.3, 0.05, false}, Case{0.8, 0.0, 0.1, true},
                 Case{0.0, 0.0, 0.1, false}}) {
    const double lr = 0.1;
    Tensor p = param_of(init);
    SGD opt({{"w", p}}, SGDOptions{lr, c.momentum, c.dampening, c.wd, c.nesterov});
    std::vector<double> ref = init, buf(init.size(), 0.0);
    for (int k = 1; k <= 3; ++k) {
      set_grad_for_step(p, k);
      opt.step();
      for (size_t i = 0; i < ref.size(); ++i) {
        double d = grad_at(k, i) + c.wd * ref[i];
        if (c.momentum != 0) {
          buf[i] = k == 1 ? d : c.momentum * buf[i] + (1 - c.dampening) * d;
          d = c.nesterov ? d + c.momentum * buf[i] : buf[i];
        }
        ref[i] -= lr * d;
      }
      const auto got = p.to_vector<double>();
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_NEAR(got[i], ref[i], 1e-14) << "momentum " << c.momentum << " step " << k;
    }
    EXPECT_EQ(opt.state_names().size(), c.momentum != 0 ? 1u : 0u);
    if (c.momentum != 0) {
      const auto b = opt.state(0, 0).tensors[0].to_vector<double>();
      for (size_t i = 0; i < buf.size(); ++i) EXPECT_NEAR(b[i], buf[i], 1e-14);
      EXPECT_TRUE(opt.state_dict().contains("state.w.momentum_buffer"));
    }
  }
}

TEST(SGD, ZeroGradAndErrors) {
  Tensor p = param_of({1.0, 2.0});
  SGD opt(std::vector<Tensor>{p}, SGDOptions{0.1, 0.9});
  set_grad_for_step(p, 1);
  opt.zero_grad(/*set_to_none=*/false);
  EXPECT_TRUE(all_close(p.grad(), zeros({2}, opts(DType::F64)), 0, 0));
  opt.zero_grad();
  EXPECT_FALSE(p.grad().defined());
  EXPECT_THROW(SGD(std::vector<Tensor>{p}, SGDOptions{0.1, 0.0, 0.0, 0.0, /*nesterov=*/true}),
               Error);
  EXPECT_THROW(SGD(std::vector<Tensor>{p}, SGDOptions{0.1, -0.5}), Error);
  // The state is keyed by index when the parameters have no names.
  set_grad_for_step(p, 1);
  opt.step();
  EXPECT_TRUE(opt.state_dict().contains("state.0.0.momentum_buffer"));
}

TEST(Optimizers, GradScaleEqualsClippingFirstBitwise) {
  expect_grad_scale_equals_clipping_first(Device::cpu());
}

TEST(Optimizers, BadGradScaleIsRejected) {
  Tensor p = param_of({1.0, 2.0});
  set_grad_for_step(p, 1);
  AdamW opt(std::vector<Tensor>{p});
  for (const Tensor& bad : {scalar_tensor(0.5, opts(DType::F32)), zeros({2}, opts(DType::F64))}) {
    const std::string msg = testing::error_of([&] { opt.step(bad); });
    EXPECT_NE(msg.find("AdamW: grad_scale must be one f64 value"), std::string::npos) << msg;
  }
  EXPECT_TRUE(all_close(p, from_vector<double>({1.0, 2.0}, {2}), 0, 0));  // nothing stepped
}

}  // namespace
}  // namespace mt::runtime::optim
