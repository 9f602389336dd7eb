// Tests of DLRM (models/dlrm): the dot interaction and the DCN-v2 cross net (values and float64
// finite-difference gradients), binary cross-entropy with logits against the direct formula and
// its gradient, the exact AUC (hand-made scores with ties, and a brute-force pair count), config
// validation and flavors, init keyed by (seed, FQN), and the headline: DLRM trained on MovieLens
// 100K on one process reaches a held-out AUC above 0.75.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "data/recsys/movielens.h"
#include "data/recsys/synthetic.h"
#include "models/dlrm/interaction.h"
#include "models/dlrm/metrics.h"
#include "models/dlrm/model.h"
#include "runtime/autograd/gradcheck.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "runtime/optim/adamw.h"
#include "tests/testing/errors.h"
#include "tests/testing/shared_data.h"
#include "tests/testing/tensor_testing.h"

namespace mt::models::dlrm {
namespace {

namespace rt = mt::runtime;
using rt::DType;
using testing::all_close;
using testing::randn64;

TEST(DlrmInteractionTest, DotInteractionValues) {
  // B = 2, d = 2, F = 2: v0 = dense, v1, v2 = embeddings.
  const Tensor dense = rt::from_vector<double>({1, 2, 3, 4}, {2, 2}, {DType::F64});
  const Tensor emb = rt::from_vector<double>({5, 6, 7, 8, -1, 0, 2, 1}, {2, 4}, {DType::F64});
  const Tensor out = dot_interaction(dense, emb, 2);
  // Row 0: v0 = (1, 2), v1 = (5, 6), v2 = (7, 8): <v0,v1> = 17, <v0,v2> = 23, <v1,v2> = 83.
  // Row 1: v0 = (3, 4), v1 = (-1, 0), v2 = (2, 1): -3, 10, -2.
  const Tensor expected =
      rt::from_vector<double>({1, 2, 17, 23, 83, 3, 4, -3, 10, -2}, {2, 5}, {DType::F64});
  EXPECT_TRUE(all_close(out, expected, 0, 0));
  EXPECT_EQ(interaction_pairs(3), (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {0, 2}, {1, 2}}));
}

TEST(DlrmInteractionTest, DotInteractionGradient) {
  const Tensor dense = randn64({3, 4}, 1);
  const Tensor emb = randn64({3, 12}, 2);
  auto r = rt::autograd::gradcheck(
      [](const std::vector<Tensor>& in) { return dot_interaction(in[0], in[1], 3); }, {dense, emb});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_NE(testing::error_of([&] { dot_interaction(dense, emb, 2); }).find("[B, F * d]"),
            std::string::npos);
}

TEST(DlrmInteractionTest, CrossNetValuesAndGradient) {
  for (int64_t rank : {0, 2}) {
    auto net = std::make_shared<CrossNet>(5, 2, rank);
    net->init_weights(3);
    net->to(DType::F64);
    const Tensor x0 = randn64({4, 5}, 7);
    // Reference: x_{l+1} = x0 * (W x_l + b) + x_l with W = U V for the low-rank net.
    Tensor x = x0.detach();
    for (int l = 0; l < 2; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      Tensor wx;
      if (rank == 0) {
        wx = rt::add(rt::matmul(x, net->slot(p + "w.weight").detach(), false, true),
                     net->slot(p + "w.bias").detach());
      } else {
        const Tensor vx = rt::matmul(x, net->slot(p + "v.weight").detach(), false, true);
        wx = rt::add(rt::matmul(vx, net->slot(p + "u.weight").detach(), false, true),
                     net->slot(p + "u.bias").detach());
      }
      x = rt::add(rt::mul(x0.detach(), wx), x);
    }
    EXPECT_TRUE(all_close((*net)(x0), x, 1e-12, 1e-12)) << "low_rank " << rank;
    auto r = rt::autograd::gradcheck(
        [net](const std::vector<Tensor>& in) { return (*net)(in[0]); }, {x0});
    EXPECT_TRUE(r.ok) << "low_rank " << rank << ": " << r.message;
  }
}

TEST(DlrmLossTest, BceMatchesDirectFormulaAndGradient) {
  const std::vector<double> xs = {-60.0, -3.5, -0.2, 0.0, 0.0, 0.7, 4.0, 60.0};
  const std::vector<double> ys = {0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0};
  const Tensor x = rt::from_vector<double>(xs, {8}, {DType::F64}).set_requires_grad(true);
  const Tensor y = rt::from_vector<double>(ys, {8}, {DType::F64});
  const Tensor per = bce_with_logits(x, y, rt::Reduction::None);
  const auto got = per.to_vector<double>();
  double total = 0.0;
  for (size_t i = 0; i < xs.size(); ++i) {
    // -[y log p + (1 - y) log(1 - p)], written with log1p for the extremes.
    const double p_log = -std::log1p(std::exp(-xs[i]));   // log sigmoid(x)
    const double q_log = -std::log1p(std::exp(xs[i]));    // log (1 - sigmoid(x))
    const double direct = -(ys[i] * p_log + (1 - ys[i]) * q_log);
    EXPECT_NEAR(got[i], direct, 1e-12 * (1 + direct)) << "x = " << xs[i] << ", y = " << ys[i];
    total += direct;
  }
  const Tensor loss = bce_with_logits(x, y);
  EXPECT_NEAR(loss.item<double>(), total / 8, 1e-12);
  EXPECT_NEAR(bce_with_logits(x, y, rt::Reduction::Sum).item<double>(), total, 1e-10);
  loss.backward();
  const auto g = x.grad().to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) {  // (sigmoid(x) - y) / N, also at x = 0 exactly
    EXPECT_NEAR(g[i], (1.0 / (1.0 + std::exp(-xs[i])) - ys[i]) / 8, 1e-15) << "x = " << xs[i];
  }
  // Finite differences (away from the kinks of nothing: the loss is smooth everywhere).
  const Tensor z = randn64({6}, 4);
  const Tensor t = rt::from_vector<double>({1, 0, 0, 1, 1, 0}, {6}, {DType::F64});
  for (auto red : {rt::Reduction::Mean, rt::Reduction::Sum, rt::Reduction::None}) {
    auto r = rt::autograd::gradcheck(
        [t, red](const std::vector<Tensor>& in) { return bce_with_logits(in[0], t, red); }, {z});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST(DlrmMetricTest, AucOnHandMadeScores) {
  EXPECT_DOUBLE_EQ(roc_auc({0.1, 0.4, 0.35, 0.8}, {0, 0, 1, 1}), 0.75);  // sklearn's example
  EXPECT_DOUBLE_EQ(roc_auc({1, 2, 3, 4}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(roc_auc({4, 3, 2, 1}, {0, 0, 1, 1}), 0.0);
  // Ties count one half: pos 0.4 beats neg 0.1 and ties neg 0.4; pos 0.8 beats both.
  EXPECT_DOUBLE_EQ(roc_auc({0.1, 0.4, 0.4, 0.8}, {0, 0, 1, 1}), 0.875);
  EXPECT_DOUBLE_EQ(roc_auc({5, 5, 5, 5, 5}, {0, 1, 0, 1, 1}), 0.5);
  // Against a brute-force count over all pairs, with many ties.
  const auto s = rt::randn({300}, rt::RandomKey(1, "s"), {DType::F64}).to_vector<double>();
  const auto u = rt::rand({300}, rt::RandomKey(1, "u"), {DType::F64}).to_vector<double>();
  std::vector<double> scores, labels;
  for (size_t i = 0; i < s.size(); ++i) {
    scores.push_back(std::round(s[i] * 3));  // ~15 distinct values
    labels.push_back(u[i] < 1.0 / (1.0 + std::exp(-s[i])) ? 1.0 : 0.0);
  }
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[i] == 1 && labels[j] == 0) {
        pairs += 1;
        wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
      }
    }
  }
  EXPECT_NEAR(roc_auc(scores, labels), wins / pairs, 1e-12);
  EXPECT_NEAR(roc_auc(rt::from_vector<double>(scores, {300}), rt::from_vector<double>(labels, {300})),
              wins / pairs, 1e-12);
  EXPECT_NE(testing::error_of([] { roc_auc({1, 2}, {1, 1}); }).find("at least one positive and one negative"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { roc_auc({1, 2}, {1, 2}); }).find("0 or 1"), std::string::npos);
}

TEST(DlrmModelTest, ArgsValidationAndFlavors) {
  for (const auto& f : flavor_names()) {
    const ModelArgs a = flavor_args(f);
    EXPECT_NO_THROW(a.validate()) << f;
  }
  EXPECT_EQ(flavor_args("criteo_small").num_features(), 26);
  EXPECT_EQ(flavor_args("movielens_small").interaction_dim(), 16 + 7 * 6 / 2);
  EXPECT_NE(testing::error_of([] { flavor_args("nope"); }).find("movielens_small"), std::string::npos);
  ModelArgs a = flavor_args("movielens_small");
  a.bottom_mlp = {32, 8};
  EXPECT_NE(testing::error_of([&] { a.validate(); }).find("bottom_mlp must end in embedding_dim"),
            std::string::npos);
  a = flavor_args("movielens_small");
  a.top_mlp = {8, 2};
  EXPECT_NE(testing::error_of([&] { a.validate(); }).find("top_mlp must end in 1"), std::string::npos);
  a = flavor_args("movielens_small");
  a.features.push_back({"user_id", 5});
  EXPECT_NE(testing::error_of([&] { Dlrm m(a); }).find("'user_id' is listed twice"), std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_interaction("cross"); }).find("\"dcn\""), std::string::npos);
}

ModelArgs tiny_args(InteractionType interaction) {
  ModelArgs a;
  a.num_dense = 3;
  a.features = {{"f0", 10}, {"f1", 7}};
  a.embedding_dim = 4;
  a.bottom_mlp = {5, 4};
  a.top_mlp = {6, 1};
  a.interaction = interaction;
  a.dcn_num_layers = 2;
  a.dcn_low_rank = 3;
  a.gradient_mode = rt::sparse::GradientMode::Dense;
  return a;
}

rt::sparse::KeyedJaggedTensor tiny_kjt() {
  // 3 samples; f0 bags {1, 2}, {}, {9}; f1 bags {0}, {6, 6}, {3}.
  return rt::sparse::KeyedJaggedTensor::from_lengths({"f0", "f1"}, {1, 2, 9, 0, 6, 6, 3},
                                                     {2, 0, 1, 1, 2, 1});
}

TEST(DlrmModelTest, InitKeyedBySeedAndFqnAndGradients) {
  for (auto type : {InteractionType::Dot, InteractionType::Dcn}) {
    Dlrm a(tiny_args(type)), b(tiny_args(type));
    a.init_weights(5);
    b.init_weights(5);
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(pa[i].first, pb[i].first);
      EXPECT_TRUE(all_close(pa[i].second, pb[i].second, 0, 0)) << pa[i].first;
    }
    EXPECT_EQ(a.slot("sparse_arch.embedding_bags.t_f0.weight").shape(), (rt::Shape{10, 4}));
    b.init_weights(6);
    EXPECT_FALSE(all_close(a.slot("top_mlp.0.weight"), b.slot("top_mlp.0.weight")));
    // Dense parameters leave out the tables.
    for (auto& [name, t] : a.dense_parameters()) EXPECT_EQ(name.find("sparse_arch"), std::string::npos);

    // Gradient w.r.t. the dense features in f64, through both MLPs, the interaction and the
    // pooled embeddings (Dense gradient mode).
    a.to(DType::F64);
    const Tensor dense = randn64({3, 3}, 9);
    const auto kjt = tiny_kjt();
    Dlrm* m = &a;
    auto r = rt::autograd::gradcheck(
        [m, kjt](const std::vector<Tensor>& in) { return (*m)(in[0], kjt); }, {dense});
    EXPECT_TRUE(r.ok) << interaction_name(type) << ": " << r.message;
    const Tensor logits = a(dense.detach(), kjt);
    EXPECT_EQ(logits.shape(), (rt::Shape{3}));
    // An empty batch gives no logits.
    const auto empty = rt::sparse::KeyedJaggedTensor::from_lengths(
        {"f0", "f1"}, std::vector<int64_t>{}, std::vector<int64_t>{}, {}, 0);
    EXPECT_EQ(a(rt::zeros({0, 3}, {DType::F64}), empty).shape(), (rt::Shape{0}));
    // Mismatched batch sizes are named.
    EXPECT_NE(testing::error_of([&] { a(rt::zeros({2, 3}, {DType::F64}), kjt); })
                  .find("hold 3 samples but the dense features 2"),
              std::string::npos);
  }
}

// The headline: DLRM (dot interaction) on MovieLens 100K, one process, held-out AUC > 0.75.
TEST(DlrmTrainingTest, MovieLensHeldOutAucAbove075) {
  REQUIRE_SHARED_FILE(dir, "ml-100k/u.data");
  const auto start = std::chrono::steady_clock::now();
  data::recsys::MovieLens ml(dir.parent_path(), {.local_batch_size = 256, .test_fraction = 0.1,
                                                 .split_seed = 0, .seed = 1});
  ModelArgs args = flavor_args("movielens_small");
  args.table_optimizer.type = rt::sparse::EmbOptimType::RowwiseAdagrad;
  args.table_optimizer.lr = 0.05;
  auto model = std::make_shared<Dlrm>(args);
  model->init_weights(42);
  rt::optim::AdamW opt(model->dense_parameters(), {.lr = 3e-3, .weight_decay = 0.0});

  auto evaluate = [&] {
    model->eval();
    rt::NoGradGuard no_grad;
    std::vector<double> scores, labels;
    for (int64_t k = 0; k < ml.num_test_batches(); ++k) {
      const auto b = ml.test_batch(k);
      const auto s = (*model)(b.dense, b.sparse).to_vector<double>();
      const auto l = b.labels.to_vector<double>();
      scores.insert(scores.end(), s.begin(), s.end());
      labels.insert(labels.end(), l.begin(), l.end());
    }
    model->train();
    return roc_auc(scores, labels);
  };

  const int64_t steps_per_epoch = int64_t(ml.train_indices().size()) / 256;
  const int epochs = 2;
  double auc = 0.0, last_loss = 0.0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    double loss_sum = 0.0;
    for (int64_t s = 0; s < steps_per_epoch; ++s) {
      const auto b = ml.next();
      opt.zero_grad();
      const Tensor loss = bce_with_logits((*model)(b.dense, b.sparse), b.labels);
      loss.backward();
      opt.step();
      loss_sum += loss.item<double>();
    }
    last_loss = loss_sum / double(steps_per_epoch);
    auc = evaluate();
    std::printf("epoch %d: train loss %.4f, held-out AUC %.4f (%.1f s)\n", epoch, last_loss, auc,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  EXPECT_GT(auc, 0.75);
  EXPECT_LT(last_loss, 0.62);
}

// DLRM with DCN-v2 low-rank cross layers (criteo_small) learns the synthetic Criteo-like data:
// held-out AUC well above chance, and not above the hidden model's own AUC.
TEST(DlrmTrainingTest, SyntheticCriteoDcnLearns) {
  const auto start = std::chrono::steady_clock::now();
  data::recsys::SyntheticCriteo gen({.table_sizes = data::recsys::criteo_table_sizes(10000),
                                     .seed = 3, .local_batch_size = 512});
  ModelArgs args = flavor_args("criteo_small");
  ASSERT_EQ(gen.table_sizes().size(), args.features.size());
  for (size_t f = 0; f < args.features.size(); ++f) {
    ASSERT_EQ(args.features[f].num_embeddings, gen.table_sizes()[f]);
    ASSERT_EQ(args.features[f].name, gen.sparse_feature_names()[f]);
  }
  args.interaction = InteractionType::Dcn;
  args.dcn_num_layers = 2;
  args.dcn_low_rank = 16;
  args.table_optimizer.lr = 0.1;
  auto model = std::make_shared<Dlrm>(args);
  model->init_weights(1);
  rt::optim::AdamW opt(model->dense_parameters(), {.lr = 3e-3, .weight_decay = 0.0});
  // Held-out: samples far beyond the ones trained on.
  std::vector<int64_t> held(8192);
  for (int64_t i = 0; i < 8192; ++i) held[size_t(i)] = 10'000'000 + i;
  const auto test = gen.make_batch(held);
  std::vector<double> truth;
  for (int64_t s : held) truth.push_back(gen.true_logit(s));
  const double best = roc_auc(truth, test.labels.to_vector<double>());
  for (int step = 0; step < 40; ++step) {
    const auto b = gen.next();
    opt.zero_grad();
    const Tensor loss = bce_with_logits((*model)(b.dense, b.sparse), b.labels);
    loss.backward();
    opt.step();
  }
  model->eval();
  rt::NoGradGuard no_grad;
  const double auc = roc_auc((*model)(test.dense, test.sparse), test.labels);
  std::printf("synthetic Criteo-like, DLRM-DCN: held-out AUC %.4f (hidden model's %.4f), %.1f s\n",
              auc, best,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  EXPECT_GT(auc, 0.7);
  EXPECT_LT(auc, best + 0.01);
}

}  // namespace
}  // namespace mt::models::dlrm
