// models/moe: router (softmax/sigmoid, bias steers the choice but not the weights, normalisation,
// scale), grouped experts vs a per-expert loop, an identity TokenDispatcher vs none, the MoE layer
// against a per-token reference (dropless, shared experts), f64 gradchecks of the layer (with and
// without the auxiliary loss) and of a whole tiny model, dense first layers and FQNs, activation
// checkpointing (same loss, gradients and token counts), load balancing (bias update, imbalance
// falling with it on and not with it off), the debug model learning, KV-cached decoding (the
// whole model and pipeline stages) against the full forward, flavor sizes vs the published ones,
// the registry, and argument errors.
#include "models/moe/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <any>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "models/llama/kv_cache.h"
#include "models/moe/experts.h"
#include "models/moe/load_balancing.h"
#include "models/moe/model.h"
#include "models/moe/model_args.h"
#include "models/moe/router.h"
#include "models/moe/token_dispatcher.h"
#include "models/registry.h"
#include "runtime/autograd/gradcheck.h"
#include "runtime/core/grad_mode.h"
#include "runtime/core/rng.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/reduce.h"
#include "runtime/optim/adamw.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::models::moe {
namespace {

using runtime::DType;
using runtime::Shape;
using testing::all_close;
using testing::error_of;
using testing::randn64;

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::F64);

ModelArgs tiny_args() {
  ModelArgs a;
  a.dim = 16;
  a.n_layers = 2;
  a.n_dense_layers = 1;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.vocab_size = 37;
  a.inter_dim = 32;
  a.moe_inter_dim = 8;
  a.n_routed_experts = 4;
  a.n_shared_experts = 1;
  a.top_k = 2;
  a.max_seq_len = 16;
  return a;
}

Tensor random_tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v(size_t(b * t));
  runtime::RandomKey key(seed, "tokens");
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(runtime::uniform_at(key, i) * double(vocab));
  return runtime::from_vector<int64_t>(v, {b, t}, TensorOptions{}.with_dtype(DType::I64));
}

std::vector<std::vector<double>> rows_of(const Tensor& t) {
  const auto v = t.to_vector<double>();
  const int64_t c = t.size(-1);
  std::vector<std::vector<double>> out;
  for (size_t i = 0; i < v.size(); i += size_t(c))
    out.emplace_back(v.begin() + i, v.begin() + i + c);
  return out;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

// One expert (or FeedForward) on one token, on the host: w2 (silu(w1 x) * (w3 x)).
std::vector<double> ffn_host(const std::vector<double>& x, const Tensor& w1, const Tensor& w2,
                             const Tensor& w3) {
  const auto a = rows_of(w1), b = rows_of(w2), c = rows_of(w3);
  std::vector<double> h(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    double g = 0, u = 0;
    for (size_t j = 0; j < x.size(); ++j) g += a[i][j] * x[j], u += c[i][j] * x[j];
    h[i] = silu(g) * u;
  }
  std::vector<double> y(b.size(), 0.0);
  for (size_t i = 0; i < b.size(); ++i)
    for (size_t j = 0; j < h.size(); ++j) y[i] += b[i][j] * h[j];
  return y;
}

// The smallest gap between the k-th and (k+1)-th biased score over the tokens.
double min_topk_margin(const Tensor& scores, const Tensor& bias, int64_t k) {
  const auto s = rows_of(scores);
  const auto bv = bias.to_vector<double>();
  double margin = 1e300;
  for (auto row : s) {
    for (size_t e = 0; e < row.size(); ++e) row[e] += bv[e];
    std::sort(row.begin(), row.end(), std::greater<>());
    margin = std::min(margin, row[size_t(k - 1)] - row[size_t(k)]);
  }
  return margin;
}

// ---- router ---------------------------------------------------------------------------------

TEST(MoeRouter, SoftmaxTopKAndWeights) {
  Router router(6, 5, 2, "softmax", false, 1.0, 0.5, kF64);
  router.init_weights(1);
  Tensor x = randn64({7, 6}, 2, false);
  RouterOutput r = router(x);
  ASSERT_EQ(r.weights.shape(), (Shape{7, 2}));
  ASSERT_EQ(r.indices.shape(), (Shape{7, 2}));
  EXPECT_EQ(r.indices.dtype(), DType::I64);
  const auto scores = rows_of(r.scores), w = rows_of(r.weights);
  const auto idx = r.indices.to_vector<int64_t>();
  const auto gate = rows_of(router.gate->weight);
  const auto xs = rows_of(x);
  for (size_t t = 0; t < 7; ++t) {
    // Reference softmax of x W^T.
    std::vector<double> logit(5), p(5);
    double mx = -1e300, z = 0;
    for (size_t e = 0; e < 5; ++e) {
      logit[e] = std::inner_product(xs[t].begin(), xs[t].end(), gate[e].begin(), 0.0);
      mx = std::max(mx, logit[e]);
    }
    for (size_t e = 0; e < 5; ++e) z += p[e] = std::exp(logit[e] - mx);
    for (size_t e = 0; e < 5; ++e) EXPECT_NEAR(scores[t][e], p[e] / z, 1e-12);
    std::vector<size_t> order(5);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    for (size_t j = 0; j < 2; ++j) {
      EXPECT_EQ(idx[t * 2 + j], int64_t(order[j]));
      EXPECT_NEAR(w[t][j], p[order[j]] / z, 1e-12);  // not renormalised
    }
  }
}

TEST(MoeRouter, SigmoidNormalisedAndScaled) {
  Router router(6, 8, 3, "sigmoid", /*route_norm=*/true, /*route_scale=*/2.5, 0.5, kF64);
  router.init_weights(3);
  Tensor x = randn64({5, 6}, 4, false);
  RouterOutput r = router(x);
  const auto s = rows_of(r.scores), w = rows_of(r.weights);
  const auto idx = r.indices.to_vector<int64_t>();
  for (size_t t = 0; t < 5; ++t) {
    double sum_top = 0;
    for (size_t j = 0; j < 3; ++j) sum_top += s[t][size_t(idx[t * 3 + j])];
    double sum_w = 0;
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_NEAR(w[t][j], 2.5 * s[t][size_t(idx[t * 3 + j])] / sum_top, 1e-12);
      sum_w += w[t][j];
    }
    EXPECT_NEAR(sum_w, 2.5, 1e-12);
    for (double v : s[t]) EXPECT_TRUE(v > 0 && v < 1);  // sigmoid, not a distribution
  }
}

TEST(MoeRouter, BiasChangesSelectionNotGateWeights) {
  Router router(6, 4, 1, "softmax", false, 1.0, 0.5, kF64);
  router.init_weights(5);
  Tensor x = randn64({9, 6}, 6, false);
  RouterOutput plain = router(x);
  // A large bias on expert 3 makes every token choose it...
  Tensor bias = runtime::from_vector<double>({0, 0, 0, 10}, {4});
  RouterOutput biased = router(x, bias);
  const auto idx = biased.indices.to_vector<int64_t>();
  for (int64_t e : idx) EXPECT_EQ(e, 3);
  // ...and its weight is expert 3's unbiased score, the same scores as without bias.
  EXPECT_TRUE(all_close(biased.scores, plain.scores, 0, 0));
  const auto s = rows_of(plain.scores), w = rows_of(biased.weights);
  for (size_t t = 0; t < 9; ++t) EXPECT_DOUBLE_EQ(w[t][0], s[t][3]);
  // The weights stay differentiable w.r.t. the gate, the choice is not.
  Tensor loss = runtime::sum(biased.weights);
  loss.backward();
  EXPECT_TRUE(router.gate->weight.grad().defined());
}

TEST(MoeRouter, ScoresAreF32For16BitInputs) {
  Router router(6, 4, 2, "softmax", false, 1.0, 0.02, TensorOptions{}.with_dtype(DType::BF16));
  router.init_weights(7);
  RouterOutput r = router(testing::randn_as({3, 6}, DType::BF16, 8));
  EXPECT_EQ(r.scores.dtype(), DType::F32);
  EXPECT_EQ(r.weights.dtype(), DType::F32);
}

// ---- experts --------------------------------------------------------------------------------

TEST(MoeExperts, GroupedEqualsPerExpertLoop) {
  GroupedExperts experts(6, 5, 4, 0.1, kF64);
  experts.init_weights(9);
  const std::vector<int64_t> counts{2, 0, 3, 1};
  Tensor x = randn64({6, 6}, 10, false);
  const auto y = rows_of(experts(x, counts));
  const auto xs = rows_of(x);
  size_t row = 0;
  for (int64_t e = 0; e < 4; ++e) {
    for (int64_t i = 0; i < counts[size_t(e)]; ++i, ++row) {
      const auto ref = ffn_host(xs[row], experts.w1.select(0, e), experts.w2.select(0, e),
                                experts.w3.select(0, e));
      for (size_t j = 0; j < ref.size(); ++j) EXPECT_NEAR(y[row][j], ref[j], 1e-12);
    }
  }
}

TEST(MoeExperts, InitStatisticsAndSlicedInitMatchesFullDraw) {
  GroupedExperts full(32, 64, 8, 0.005, TensorOptions{});
  full.init_weights(11);
  auto stddev = [](const Tensor& t) {
    const auto v = t.to_vector<double>();
    double s2 = 0;
    for (double x : v) s2 += x * x;
    return std::sqrt(s2 / double(v.size()));
  };
  EXPECT_NEAR(stddev(full.w1), 0.02, 0.002);
  EXPECT_NEAR(stddev(full.w2), 0.005, 0.0005);
  EXPECT_NEAR(stddev(full.w3), 0.005, 0.0005);
  // A module holding experts [4, 6) only (expert parallelism) draws the same values there.
  GroupedExperts part(32, 64, 8, 0.005, TensorOptions{});
  part.w1 = runtime::zeros({2, 64, 32}).set_requires_grad(true);
  part.w2 = runtime::zeros({2, 32, 64}).set_requires_grad(true);
  part.w3 = runtime::zeros({2, 64, 32}).set_requires_grad(true);
  part.expert_begin = 4;
  part.init_weights(11);
  EXPECT_TRUE(all_close(part.w1, full.w1.narrow(0, 4, 2), 0, 0));
  EXPECT_TRUE(all_close(part.w2, full.w2.narrow(0, 4, 2), 0, 0));
  EXPECT_TRUE(all_close(part.w3, full.w3.narrow(0, 4, 2), 0, 0));
}

// A dispatcher that keeps every row where it is (all experts local), counting its calls.
struct IdentityDispatcher : TokenDispatcher {
  std::pair<Tensor, std::vector<int64_t>> dispatch(const Tensor& x,
                                                   const std::vector<int64_t>& counts) override {
    ++dispatches;
    return {x, counts};
  }
  Tensor combine(const Tensor& y) override {
    ++combines;
    return y;
  }
  int dispatches = 0, combines = 0;
};

TEST(MoeExperts, IdentityDispatcherGivesTheSameResultsAsNone) {
  auto run = [](bool with_dispatcher, std::shared_ptr<IdentityDispatcher> d) {
    GroupedExperts experts(6, 5, 4, 0.1, kF64);
    experts.init_weights(12);
    if (with_dispatcher) experts.dispatcher = d;
    Tensor x = randn64({7, 6}, 13);
    Tensor y = experts(x, {3, 0, 2, 2});
    runtime::sum(runtime::mul(y, y)).backward();
    return std::vector<Tensor>{y.detach(), x.grad(), experts.w1.grad(), experts.w2.grad(),
                               experts.w3.grad()};
  };
  auto d = std::make_shared<IdentityDispatcher>();
  const auto a = run(false, nullptr), b = run(true, d);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(all_close(a[i], b[i], 0, 0)) << i;
  EXPECT_EQ(d->dispatches, 1);
  EXPECT_EQ(d->combines, 1);
}

TEST(MoeExperts, SlicedWeightsWithoutDispatcherAreRefused) {
  GroupedExperts experts(6, 5, 4, 0.1, kF64);
  experts.w1 = runtime::zeros({2, 5, 6}, kF64);
  EXPECT_NE(error_of([&] {
              experts(randn64({2, 6}, 14, false), {1, 1, 0, 0});
            }).find("hold 2 of 4 experts but no TokenDispatcher"),
            std::string::npos);
}

// ---- the MoE layer ----------------------------------------------------------------------------

// A MoE layer in f64 whose router separates experts clearly (gate scaled up).
std::shared_ptr<MoE> make_moe(const ModelArgs& args, uint64_t seed) {
  auto moe = std::make_shared<MoE>(args, 0.1, kF64);
  moe->init_weights(seed);
  runtime::NoGradGuard no_grad;
  runtime::mul_(moe->router->gate->weight, 25.0);
  return moe;
}

TEST(MoeLayer, EqualsPerTokenReferenceAndIsDropless) {
  ModelArgs args = tiny_args();
  args.n_routed_experts = 5;
  args.top_k = 2;
  auto moe = make_moe(args, 15);
  Tensor x = randn64({2, 6, 16}, 16, false);
  Tensor out;
  {
    runtime::NoGradGuard no_grad;  // no_grad: evaluation, tokens are not counted
    out = (*moe)(x);
  }
  EXPECT_EQ(moe->tokens_per_expert_counts(), std::vector<int64_t>(5, 0));
  const RouterOutput r = (*moe->router)(x.reshape({12, 16}), moe->expert_bias);
  const auto xs = rows_of(x.reshape({12, 16})), ys = rows_of(out.reshape({12, 16}));
  const auto w = rows_of(r.weights);
  const auto idx = r.indices.to_vector<int64_t>();
  EXPECT_TRUE(all_close(moe->last_indices, r.indices, 0, 0));
  std::vector<int64_t> seen(5, 0);
  for (size_t t = 0; t < 12; ++t) {
    std::vector<double> ref =
        ffn_host(xs[t], moe->shared_experts->w1->weight, moe->shared_experts->w2->weight,
                 moe->shared_experts->w3->weight);
    for (size_t j = 0; j < 2; ++j) {
      const int64_t e = idx[t * 2 + j];
      ++seen[size_t(e)];
      const auto ye = ffn_host(xs[t], moe->experts->w1.select(0, e), moe->experts->w2.select(0, e),
                               moe->experts->w3.select(0, e));
      for (size_t c = 0; c < ref.size(); ++c) ref[c] += w[t][j] * ye[c];
    }
    for (size_t c = 0; c < ref.size(); ++c) EXPECT_NEAR(ys[t][c], ref[c], 1e-12) << t;
  }
  // Dropless: a training forward counts every token top_k times.
  Tensor y2 = (*moe)(x);
  const auto counted = moe->tokens_per_expert_counts();
  EXPECT_EQ(counted, seen);
  EXPECT_EQ(std::accumulate(counted.begin(), counted.end(), int64_t(0)), 12 * 2);
  EXPECT_TRUE(all_close(y2, out, 0, 0));  // deterministic
  (*moe)(x);
  EXPECT_EQ(moe->tokens_per_expert_counts()[0], 2 * seen[0]);  // summed until reset
  moe->reset_tokens_per_expert();
  EXPECT_EQ(moe->tokens_per_expert_counts(), std::vector<int64_t>(5, 0));
}

TEST(MoeLayer, SharedExpertsAddTheirFeedForward) {
  ModelArgs with = tiny_args(), without = tiny_args();
  with.n_shared_experts = 2;
  without.n_shared_experts = 0;
  auto a = make_moe(with, 17), b = make_moe(without, 17);
  EXPECT_EQ(b->shared_experts, nullptr);
  EXPECT_EQ(a->shared_experts->w1->weight.shape(), (Shape{16, 16}));  // 2 x moe_inter_dim 8
  Tensor x = randn64({1, 5, 16}, 18, false);
  runtime::NoGradGuard no_grad;
  Tensor diff = runtime::sub((*a)(x), (*b)(x));
  EXPECT_TRUE(all_close(diff, (*a->shared_experts)(x), 1e-12, 1e-10));
}

TEST(MoeLayer, GradcheckF64SoftmaxAndSigmoid) {
  for (const char* fn : {"softmax", "sigmoid"}) {
    ModelArgs args = tiny_args();
    args.dim = 6;
    args.moe_inter_dim = 4;
    args.n_routed_experts = 4;
    args.top_k = 2;
    args.score_func = fn;
    args.route_norm = std::string(fn) == "sigmoid";
    args.route_scale = 1.5;
    auto moe = make_moe(args, 19);
    Tensor x = randn64({2, 3, 6}, 20);
    // Clear top-k margins: a perturbation of 1e-6 cannot flip the routing.
    const RouterOutput r = (*moe->router)(x.detach().reshape({6, 6}), moe->expert_bias);
    ASSERT_GT(min_topk_margin(r.scores, moe->expert_bias, 2), 1e-3) << fn;
    std::vector<Tensor> inputs{x};
    for (const auto& [name, p] : moe->named_parameters()) inputs.push_back(p);
    auto result = runtime::autograd::gradcheck(
        [moe](const std::vector<Tensor>& in) { return (*moe)(in[0]); }, inputs);
    EXPECT_TRUE(result.ok) << fn << ": " << result.message;
  }
}

TEST(MoeLayer, AuxLossValueAndGradcheck) {
  ModelArgs args = tiny_args();
  args.dim = 6;
  args.moe_inter_dim = 4;
  args.n_routed_experts = 4;
  args.top_k = 2;
  args.score_func = "sigmoid";
  args.aux_loss_alpha = 0.01;
  auto moe = make_moe(args, 21);
  ASSERT_TRUE(moe->has_aux_loss());
  // Inputs whose routing has clear top-k margins (sigmoid scores saturate easily): the first
  // seed that gives them.
  Tensor x;
  for (uint64_t seed = 22; seed < 60 && !x.defined(); ++seed) {
    Tensor c = randn64({2, 3, 6}, seed);
    const RouterOutput rc = (*moe->router)(c.detach().reshape({6, 6}), moe->expert_bias);
    if (min_topk_margin(rc.scores, moe->expert_bias, 2) > 1e-3) x = c;
  }
  ASSERT_TRUE(x.defined()) << "no input with clear routing margins";
  std::vector<Tensor> out = moe->forward(x);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].dim(), 0);
  // Reference: alpha * mean_b sum_i f_i P_i.
  const RouterOutput r = (*moe->router)(x.detach().reshape({6, 6}), moe->expert_bias);
  const auto s = rows_of(r.scores);
  const auto idx = r.indices.to_vector<int64_t>();
  double ref = 0;
  for (int64_t b = 0; b < 2; ++b) {
    std::vector<double> f(4, 0), p(4, 0);
    for (int64_t t = 0; t < 3; ++t) {
      const auto& row = s[size_t(b * 3 + t)];
      const double z = std::accumulate(row.begin(), row.end(), 0.0);
      for (size_t e = 0; e < 4; ++e) p[e] += row[e] / z / 3.0;
      for (int64_t j = 0; j < 2; ++j) f[size_t(idx[size_t((b * 3 + t) * 2 + j)])] += 4.0 / (2 * 3);
    }
    for (size_t e = 0; e < 4; ++e) ref += 0.01 * f[e] * p[e] / 2.0;
  }
  EXPECT_NEAR(out[1].item<double>(), ref, 1e-14);
  ASSERT_GT(min_topk_margin(r.scores, moe->expert_bias, 2), 1e-3);
  std::vector<Tensor> inputs{x};
  for (const auto& [name, p] : moe->named_parameters()) inputs.push_back(p);
  auto result = runtime::autograd::gradcheck(
      [moe](const std::vector<Tensor>& in) {
        std::vector<Tensor> o = moe->forward(in[0]);
        return runtime::add(runtime::sum(o[0]), runtime::mul(o[1], 100.0));
      },
      inputs);
  EXPECT_TRUE(result.ok) << result.message;
}

// ---- the model ------------------------------------------------------------------------------

std::vector<std::string> names(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> out;
  for (const auto& [k, t] : v) out.push_back(k);
  return out;
}

TEST(MoeModel, DenseFirstLayersAndTorchtitanFqns) {
  ModelArgs args = tiny_args();
  args.n_layers = 3;
  args.n_dense_layers = 2;
  Transformer model(args);
  ASSERT_EQ(model.blocks.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(model.blocks[size_t(i)]->feed_forward, nullptr);
    EXPECT_EQ(model.blocks[size_t(i)]->moe, nullptr);
  }
  EXPECT_EQ(model.blocks[2]->feed_forward, nullptr);
  EXPECT_NE(model.blocks[2]->moe, nullptr);
  EXPECT_EQ(model.moe_layers().size(), 1u);
  const auto params = names(model.named_parameters());
  std::vector<std::string> expect_l2{"layers.2.attention.wq.weight",
                                     "layers.2.attention.wk.weight",
                                     "layers.2.attention.wv.weight",
                                     "layers.2.attention.wo.weight",
                                     "layers.2.moe.experts.w1",
                                     "layers.2.moe.experts.w2",
                                     "layers.2.moe.experts.w3",
                                     "layers.2.moe.router.gate.weight",
                                     "layers.2.moe.shared_experts.w1.weight",
                                     "layers.2.moe.shared_experts.w2.weight",
                                     "layers.2.moe.shared_experts.w3.weight",
                                     "layers.2.attention_norm.weight",
                                     "layers.2.ffn_norm.weight"};
  std::vector<std::string> got_l2;
  for (const auto& n : params)
    if (n.rfind("layers.2.", 0) == 0) got_l2.push_back(n);
  EXPECT_EQ(got_l2, expect_l2);
  EXPECT_NE(std::find(params.begin(), params.end(), "layers.0.feed_forward.w1.weight"),
            params.end());
  // expert_bias is checkpointed, tokens_per_expert is not; neither is a parameter.
  const auto state = model.state_dict();
  EXPECT_TRUE(state.contains("layers.2.moe.expert_bias"));
  EXPECT_FALSE(state.contains("layers.2.moe.tokens_per_expert"));
  EXPECT_EQ(std::find(params.begin(), params.end(), "layers.2.moe.expert_bias"), params.end());
  // num_params counts every unique parameter.
  int64_t n = 0;
  for (const auto& [k, t] : model.named_parameters()) n += t.numel();
  EXPECT_EQ(count_parameters(args).total, n);
  EXPECT_EQ(model.blocks[2]->moe->experts->w1.shape(), (Shape{4, 8, 16}));
  EXPECT_EQ(model.blocks[2]->moe->experts->w2.shape(), (Shape{4, 16, 8}));
}

TEST(MoeModel, InitIsKeyedBySeedAndFqn) {
  Transformer a(tiny_args(), 3), b(tiny_args(), 3), c(tiny_args(), 4);
  const auto sa = a.state_dict(), sb = b.state_dict(), sc = c.state_dict();
  for (const auto& [k, t] : sa) EXPECT_TRUE(all_close(t, sb.at(k), 0, 0)) << k;
  EXPECT_FALSE(all_close(sa.at("layers.1.moe.experts.w1"), sc.at("layers.1.moe.experts.w1")));
}

TEST(MoeModel, GradcheckWholeTinyModelF64) {
  ModelArgs args = tiny_args();
  args.dim = 8;
  args.n_heads = 2;
  args.n_kv_heads = 1;
  args.inter_dim = 8;
  args.moe_inter_dim = 4;
  args.vocab_size = 11;
  args.aux_loss_alpha = 0.1;
  Transformer model(args, 23, kF64);
  {
    runtime::NoGradGuard no_grad;
    runtime::mul_(model.blocks[1]->moe->router->gate->weight, 40.0);
  }
  Tensor tokens = random_tokens(2, 4, 11, 24), targets = random_tokens(2, 4, 11, 25);
  std::vector<Tensor> inputs;
  for (const auto& [name, p] : model.named_parameters()) inputs.push_back(p);
  auto result = runtime::autograd::gradcheck(
      [&](const std::vector<Tensor>&) {
        Transformer::Output o = model.forward_with_aux(tokens);
        return runtime::add(runtime::cross_entropy(o.logits, targets), o.aux_loss);
      },
      inputs);
  EXPECT_TRUE(result.ok) << result.message;
}

// Decoding with llama's KV cache: a prompt of 5 then one token at a time gives the full forward's
// logits at every position (f64), on the whole model and through two pipeline stages (each with a
// cache of its own layers); the registry's decoding hooks run the same; a stage's cache does not
// fit the other stage.
TEST(MoeModel, CachedDecodingEqualsTheFullForward) {
  ModelArgs args = tiny_args();
  Transformer whole(args, 31, kF64);
  Transformer first(args, 31, kF64, llama::LayerRange{0, 1});
  Transformer last(args, 31, kF64, llama::LayerRange{1, 2});
  const Tensor tokens = random_tokens(1, 12, 37, 32);
  const Tensor full = whole(tokens);
  const ModelSpec spec = get_model_spec("deepseek_v3", "moe_debug");
  llama::KVCache cache = whole.make_kv_cache(1), c0 = first.make_kv_cache(1);
  llama::KVCache c1 = spec.make_kv_cache(last, DType::F64, 1);
  EXPECT_EQ(c1.first_layer(), 1);
  EXPECT_EQ(c1.n_layers(), 1);
  for (int64_t p = 0; p < 12;) {
    const int64_t n = p == 0 ? 5 : 1;
    const Tensor chunk = tokens.narrow(1, p, n);
    const Tensor want = full.narrow(1, p, n);
    EXPECT_TRUE(all_close(whole.forward_cached(chunk, cache), want, 1e-12, 0)) << "at " << p;
    const Tensor staged = spec.forward_cached(last, first.forward_cached(chunk, c0), c1);
    EXPECT_TRUE(all_close(staged, want, 1e-12, 0)) << "at " << p;
    p += n;
  }
  EXPECT_EQ(cache.length(), 12);
  EXPECT_EQ(c1.length(), 12);
  EXPECT_THROW(first.forward_cached(tokens.narrow(1, 0, 1), c1), mt::Error);
  EXPECT_EQ(c1.length(), 12);
}

TEST(MoeModel, ActivationCheckpointingSameLossGradsAndCounts) {
  ModelArgs args = tiny_args();
  args.aux_loss_alpha = 0.05;
  auto run = [&](const std::string& spec) {
    Transformer model(args, 26, kF64);
    model.set_activation_checkpointing(llama::parse_activation_checkpointing(spec));
    Tensor tokens = random_tokens(2, 8, args.vocab_size, 27);
    Transformer::Output o = model.forward_with_aux(tokens);
    Tensor loss =
        runtime::add(runtime::cross_entropy(o.logits, random_tokens(2, 8, 37, 28)), o.aux_loss);
    loss.backward();
    std::vector<Tensor> out{loss.detach()};
    for (const auto& [k, p] : model.named_parameters()) out.push_back(p.grad());
    out.push_back(model.blocks[1]->moe->tokens_per_expert.clone());
    return out;
  };
  const auto a = run("none");
  // By op, the recompute reuses the routed experts' kept grouped matmuls and some others.
  for (const std::string spec : {"full", "selective:op"}) {
    SCOPED_TRACE(spec);
    const auto b = run(spec);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(all_close(a[i], b[i], 1e-13, 1e-11)) << i;
    // Counted once despite the recompute: 16 tokens x top 2.
    EXPECT_EQ(runtime::sum(b.back()).item<int64_t>(), 32);
  }
}

// ---- load balancing -------------------------------------------------------------------------

TEST(MoeLoadBalancing, BiasMovesTowardBalanceAndCountsReset) {
  ModelArgs args = tiny_args();
  args.load_balance_coeff = 0.01;
  Transformer model(args);
  auto moe = model.blocks[1]->moe;
  {
    runtime::NoGradGuard no_grad;
    moe->tokens_per_expert.copy_(
        runtime::from_vector<int64_t>({10, 2, 4, 0}, {4}, TensorOptions{}.with_dtype(DType::I64)));
  }
  int reduced = 0;
  auto metrics = update_expert_bias(model, [&](Tensor& t) {
    ++reduced;
    EXPECT_EQ(t.shape(), (Shape{1, 4}));
    runtime::NoGradGuard no_grad;
    runtime::mul_(t, 2.0);  // as if a second rank had routed the same tokens
  });
  EXPECT_EQ(reduced, 1);
  // mean 4: expert 0 over-loaded (-), 1 and 3 under-loaded (+), 2 exact (0); centred.
  const auto bias = moe->expert_bias.to_vector<double>();
  const double mean_delta = (-0.01 + 0.01 + 0 + 0.01) / 4;
  EXPECT_NEAR(bias[0], -0.01 - mean_delta, 1e-7);
  EXPECT_NEAR(bias[1], 0.01 - mean_delta, 1e-7);
  EXPECT_NEAR(bias[2], 0.0 - mean_delta, 1e-7);
  EXPECT_NEAR(bias[3], 0.01 - mean_delta, 1e-7);
  EXPECT_NEAR(metrics.at("moe_load_imbalance"), 20.0 / 8.0, 1e-12);
  EXPECT_NEAR(metrics.at("moe_load_imbalance_layer1"), 20.0 / 8.0, 1e-12);
  EXPECT_EQ(moe->tokens_per_expert_counts(), std::vector<int64_t>(4, 0));
  // Nothing routed since: no metrics, no change.
  EXPECT_TRUE(update_expert_bias(model, nullptr).empty());
  EXPECT_EQ(moe->expert_bias.to_vector<double>(), bias);
}

// The imbalance of a model whose routing starts skewed (bias toward experts 0 and 1) after
// `steps` rounds of forward + update_expert_bias.
std::pair<double, double> imbalance_first_and_last(double coeff, int steps) {
  ModelArgs args = tiny_args();
  args.n_routed_experts = 8;
  args.top_k = 2;
  args.load_balance_coeff = coeff;
  Transformer model(args, 29);
  auto moe = model.blocks[1]->moe;
  {
    runtime::NoGradGuard no_grad;
    moe->expert_bias.copy_(runtime::from_vector<double>({0.05, 0.05, 0, 0, 0, 0, 0, 0}, {8}));
  }
  Tensor tokens = random_tokens(4, 16, args.vocab_size, 30);
  double first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    model(tokens);  // grad mode on: a training forward, counted
    const double r = update_expert_bias(model, nullptr).at("moe_load_imbalance");
    if (s == 0) first = r;
    last = r;
  }
  return {first, last};
}

TEST(MoeLoadBalancing, ImbalanceFallsWithBiasUpdatesAndNotWithout) {
  const auto on = imbalance_first_and_last(2e-3, 60);
  const auto off = imbalance_first_and_last(0.0, 60);
  EXPECT_NEAR(on.first, 4.0, 1e-12);  // every token on experts 0 and 1: 8 / 2
  EXPECT_NEAR(off.first, 4.0, 1e-12);
  EXPECT_NEAR(off.second, 4.0, 1e-12);
  EXPECT_LT(on.second, 2.0) << "imbalance after 60 updates: " << on.second;
}

// ---- training, flavors, registry -------------------------------------------------------------

TEST(MoeModel, DebugModelLossFallsWithAdamW) {
  ModelSpec spec = get_model_spec("deepseek_v3", "moe_debug");
  auto& args = std::any_cast<ModelArgs&>(*spec.args);
  args.vocab_size = 128;
  args.aux_loss_alpha = 1e-3;
  auto model = spec.build({.seed = 31});
  runtime::optim::AdamW opt(model->named_parameters(), {.lr = 3e-3, .weight_decay = 0.0});
  Tensor tokens = random_tokens(2, 32, 128, 32), targets = random_tokens(2, 32, 128, 33);
  std::vector<double> losses;
  std::map<std::string, double> metrics;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    Tensor loss = spec.loss(*model, tokens, targets, runtime::Reduction::Mean);
    loss.backward();
    opt.step();
    metrics = spec.after_optimizer_step(*model, [](Tensor&) {});
    losses.push_back(loss.item<double>());
  }
  EXPECT_NEAR(losses.front(), std::log(128.0), 0.5);
  EXPECT_LT(losses.back(), losses.front() - 1.0) << losses.front() << " -> " << losses.back();
  EXPECT_EQ(metrics.count("moe_load_imbalance"), 1u);
  EXPECT_EQ(metrics.count("moe_load_imbalance_layer3"), 1u);
  EXPECT_EQ(metrics.count("moe_load_imbalance_layer0"), 0u);  // dense
}

TEST(MoeModel, SumLossAddsTokenWeightedAuxOnlyWhenTraining) {
  ModelSpec spec = get_model_spec("deepseek_v3", "moe_debug");
  auto& args = std::any_cast<ModelArgs&>(*spec.args);
  args.vocab_size = 64;
  args.aux_loss_alpha = 0.5;
  auto model = spec.build({.seed = 34});
  auto* t = dynamic_cast<Transformer*>(model.get());
  ASSERT_NE(t, nullptr);
  Tensor tokens = random_tokens(2, 8, 64, 35);
  std::vector<int64_t> tv = random_tokens(2, 8, 64, 36).to_vector<int64_t>();
  tv[0] = tv[5] = -100;  // 14 valid targets
  Tensor targets =
      runtime::from_vector<int64_t>(tv, {2, 8}, TensorOptions{}.with_dtype(DType::I64));
  const Transformer::Output o = t->forward_with_aux(tokens);
  const double ce =
      runtime::cross_entropy(o.logits, targets, -100, runtime::Reduction::Sum).item<double>();
  const double aux = o.aux_loss.item<double>();
  EXPECT_GT(aux, 0.0);
  EXPECT_NEAR(spec.loss(*model, tokens, targets, runtime::Reduction::Sum).item<double>(),
              ce + 14 * aux, 1e-6 * ce);  // f32 model
  runtime::NoGradGuard no_grad;
  EXPECT_NEAR(spec.loss(*model, tokens, targets, runtime::Reduction::Sum).item<double>(), ce,
              1e-6 * ce);
}

TEST(MoeModel, Bf16ParametersGiveF32LogitsCloseToF32) {
  ModelArgs args = tiny_args();
  Transformer f32(args, 37), bf16(args, 37, TensorOptions{}.with_dtype(DType::BF16));
  Tensor tokens = random_tokens(2, 8, args.vocab_size, 38);
  runtime::NoGradGuard no_grad;
  Tensor a = f32(tokens), b = bf16(tokens);
  EXPECT_EQ(b.dtype(), DType::F32);
  EXPECT_EQ(bf16.blocks[1]->moe->expert_bias.dtype(), DType::F32);
  // Same routing unless a bf16 rounding flips a near tie; the logits stay close either way.
  EXPECT_TRUE(all_close(b, a, 0.05, 0.05));
}

// As for llama: the training loss of a bf16 model reads its bf16 logits, with the values (loss
// in f32, aux loss added, gradients) of the f32 cast that operator() returns, bitwise.
TEST(MoeModel, Bf16LossReadsBf16LogitsWithTheF32LogitsValues) {
  ModelSpec spec = get_model_spec("deepseek_v3", "moe_debug");
  std::any_cast<ModelArgs&>(*spec.args).vocab_size = 64;
  auto fused = spec.build({.seed = 41, .dtype = DType::BF16});
  auto cast = spec.build({.seed = 41, .dtype = DType::BF16});
  Tensor tokens = random_tokens(2, 8, 64, 42), targets = random_tokens(2, 8, 64, 43);
  const Transformer::Output o = dynamic_cast<Transformer&>(*cast).forward_with_aux(tokens);
  ASSERT_EQ(o.logits.dtype(), DType::F32);
  Tensor want = runtime::cross_entropy(o.logits, targets);
  if (o.aux_loss.defined()) want = runtime::add(want, o.aux_loss.to(want.dtype()));
  const Tensor got = spec.loss(*fused, tokens, targets, runtime::Reduction::Mean);
  ASSERT_EQ(got.dtype(), DType::F32);
  EXPECT_EQ(got.item<double>(), want.item<double>());
  got.backward();
  want.backward();
  // Parameters without a gradient (non-trainable expert biases) are skipped.
  const auto pc = cast->named_parameters();
  EXPECT_GT(testing::expect_same_gradients(fused->named_parameters(), pc), pc.size() / 2);
}

TEST(MoeFlavors, SizesCloseToPublished) {
  // Published (MLA attention): DeepSeek-V2-Lite 15.7B total / 2.4B active, DeepSeek-V3 671B /
  // 37B. GQA's 4 dim^2 attention parameters differ from MLA's (+3M/layer for 16B, +18M/layer for
  // 671B) and the published active counts round; hence 1% on totals and 6% on active counts.
  const ParamCounts b16 = count_parameters(flavor_args("16B"));
  const ParamCounts b671 = count_parameters(flavor_args("671B"));
  std::printf("16B:  total %.3fB, active %.3fB, flops/token (seq 4096) %.3e\n",
              double(b16.total) / 1e9, double(b16.active) / 1e9,
              flops_per_token(flavor_args("16B"), 4096));
  std::printf("671B: total %.3fB, active %.3fB, flops/token (seq 4096) %.3e\n",
              double(b671.total) / 1e9, double(b671.active) / 1e9,
              flops_per_token(flavor_args("671B"), 4096));
  EXPECT_NEAR(double(b16.total) / 15.7e9, 1.0, 0.01);
  EXPECT_NEAR(double(b16.active) / 2.4e9, 1.0, 0.06);
  EXPECT_NEAR(double(b671.total) / 671e9, 1.0, 0.01);
  EXPECT_NEAR(double(b671.active) / 37e9, 1.0, 0.06);
  // FLOPs count the active parameters only: 6 * active + attention scores.
  const ModelArgs a = flavor_args("671B");
  EXPECT_DOUBLE_EQ(flops_per_token(a, 4096),
                   6.0 * double(b671.active) + 12.0 * 61 * 128 * 56 * 4096.0);
  EXPECT_LT(6.0 * double(b671.active), 0.1 * 6.0 * double(b671.total));
}

TEST(MoeFlavors, RegistryListsDeepseekV3) {
  const auto names_ = model_names();
  EXPECT_NE(std::find(names_.begin(), names_.end(), "deepseek_v3"), names_.end());
  EXPECT_EQ(model_flavors("deepseek_v3"), (std::vector<std::string>{"moe_debug", "16B", "671B"}));
  ModelSpec spec = get_model_spec("deepseek_v3", "671B");
  EXPECT_EQ(spec.num_params(), count_parameters(flavor_args("671B")).total);
  EXPECT_TRUE(spec.after_optimizer_step != nullptr);
  EXPECT_EQ(get_model_spec("llama3", "debugmodel").after_optimizer_step, nullptr);
  EXPECT_NE(error_of([] { get_model_spec("deepseek_v3", "236B"); }).find("moe_debug, 16B, 671B"),
            std::string::npos);
}

TEST(MoeArgs, ValidationNamesTheField) {
  ModelArgs a = tiny_args();
  a.top_k = 5;
  EXPECT_NE(error_of([&] { a.validate(); }).find("top_k 5 outside [1, n_routed_experts = 4]"),
            std::string::npos);
  a = tiny_args();
  a.score_func = "relu";
  EXPECT_NE(error_of([&] { a.validate(); }).find("score_func 'relu'"), std::string::npos);
  a = tiny_args();
  a.n_dense_layers = 3;
  EXPECT_NE(error_of([&] { a.validate(); }).find("n_dense_layers 3 outside"), std::string::npos);
  a = tiny_args();
  a.load_balance_coeff = -1;
  EXPECT_NE(error_of([&] { a.validate(); }).find("load_balance_coeff"), std::string::npos);
  a = tiny_args();
  a.n_heads = 3;
  EXPECT_NE(error_of([&] { Transformer m(a); }).find("not divisible by n_heads 3"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::models::moe
