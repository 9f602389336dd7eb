// DLRM parallelized on real ranks (mpirun -np 2 and 4; models/dlrm/parallelize.h): sharded
// tables (a mixed plan: user_id / item_id row_wise, the small tables table_wise or
// data_parallel) and FSDP on the dense layers, against the 1-process run over the same global
// batches on MovieLens 100K (skipped when ../shared/data/ml-100k is absent):
//   (a) five steps (dense SGD, fused row-wise Adagrad tables): the global losses, the dense
//       gradients (gathered) and, after every step, the table rows and dense parameters equal the
//       1-process run to ~1e-6;
//   (b) the headline: trained on a shorter schedule than dlrm_test's 1-process MovieLens test (one
//       epoch at a global batch of 1024 instead of two at 256, so np 4 stays well under a minute
//       on 2 cores), the held-out AUC on N ranks equals the 1-rank AUC under the same schedule
//       (computed here by rank 0, parallelized over a 1-rank group and unparallelized: those two
//       agree to 1e-6) to 2e-4, and is > 0.75 (the AUCs are printed);
//   (c) RowSparse tables with clipping: the total norm (dense + tables) equals the 1-process norm,
//       and the clipped step gives the same rows and dense parameters.
// Each rank's local batch is B samples; the 1-process reference reads a world-size-1 loader with
// batch B * W, which holds the same samples (rank r has global rows b * W + r, data/recsys).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "data/recsys/movielens.h"
#include "models/dlrm/metrics.h"
#include "models/dlrm/model.h"
#include "models/dlrm/parallelize.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/embedding/sharding_plan.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/optim/sgd.h"
#include "runtime/sparse/row_sparse_grad.h"
#include "tests/testing/shared_data.h"
#include "tests/testing/tensor_testing.h"

namespace mt::models::dlrm {
namespace {

namespace rt = mt::runtime;
namespace par = mt::parallel;
using data::recsys::MovieLens;
using data::recsys::RecsysBatch;

std::shared_ptr<par::ProcessGroup> world() {
  static std::shared_ptr<par::ProcessGroup> pg(par::MpiProcessGroup::world());
  return pg;
}

std::shared_ptr<par::DeviceMesh> dp_mesh() {
  static std::shared_ptr<par::DeviceMesh> mesh =
      par::DeviceMesh::create(world(), {world()->size()}, {"dp_shard"});
  return mesh;
}

ModelArgs movielens_args(rt::sparse::GradientMode mode) {
  ModelArgs args = flavor_args("movielens_small");
  args.table_optimizer.type = rt::sparse::EmbOptimType::RowwiseAdagrad;
  args.table_optimizer.lr = 0.05;
  args.gradient_mode = mode;
  return args;
}

// user_id / item_id row_wise, genres and occupation table_wise on different ranks, age and
// gender data_parallel.
par::ShardingPlan mixed_plan(const ModelArgs& args) {
  const int W = world()->size();
  par::ShardingPlan plan;
  plan.world_size = W;
  for (const auto& t : args.table_configs()) {
    if (t.name == "t_user_id" || t.name == "t_item_id") {
      plan.tables[t.name] = par::row_wise_sharding(t, W);
    } else if (t.name == "t_genres") {
      plan.tables[t.name] = par::table_wise_sharding(t, W - 1);
    } else if (t.name == "t_occupation") {
      plan.tables[t.name] = par::table_wise_sharding(t, 1 % W);
    } else {
      plan.tables[t.name] = par::data_parallel_sharding(t, W);
    }
  }
  return plan;
}

MovieLens loader(const std::filesystem::path& dir, int64_t batch, int64_t rank, int64_t world) {
  return MovieLens(dir, {.local_batch_size = batch, .test_fraction = 0.1, .split_seed = 0,
                         .seed = 1, .rank = rank, .world_size = world});
}

double sum_over_ranks(double v) {
  Tensor t = rt::from_vector<double>({v}, {1}, {rt::DType::F64});
  world()->all_reduce(t, par::ReduceOp::Sum, "test.sum");
  return t.item<double>();
}

// The whole value (or gradient) of every dense parameter, gathered from the FSDP shards.
std::vector<Tensor> gathered_dense(Dlrm& model, bool grads) {
  std::vector<Tensor> out;
  for (const auto& p : par::distributed_parameters(model)) {
    if (p.fqn.rfind("sparse_arch.", 0) == 0) continue;
    EXPECT_NE(p.dtensor, nullptr) << p.fqn;
    if (p.dtensor == nullptr) continue;
    par::DTensor d = *p.dtensor;
    if (grads) d.local = p.param.grad().defined() ? p.param.grad() : rt::zeros_like(p.param);
    out.push_back(d.full_tensor());
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> reference_dense(const Dlrm& ref) {
  return ref.dense_parameters();
}

// Every shard this rank holds equals its block of the reference's table.
void expect_rows_match(Dlrm& model, Dlrm& ref, double tol) {
  auto& sharded = dynamic_cast<ShardedSparseArch&>(model.sparse_arch()).collection();
  auto& plain = dynamic_cast<EmbeddingBagSparseArch&>(ref.sparse_arch()).collection();
  const auto tables = plain.table_configs();
  const auto weights = plain.weights();
  for (const par::LocalShard& s : sharded.local_shards()) {
    size_t t = 0;
    while (tables[t].name != s.table) ++t;
    EXPECT_TRUE(testing::all_close(s.weight,
                                   weights[t]
                                       .narrow(0, s.placement.row_offset, s.placement.num_rows)
                                       .narrow(1, s.placement.col_offset, s.placement.num_cols),
                                   tol, tol))
        << s.fqn << " on rank " << world()->rank();
  }
}

void expect_dense_match(Dlrm& model, const Dlrm& ref, bool grads, double atol, double rtol) {
  const auto got = gathered_dense(model, grads);
  const auto want = reference_dense(ref);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const Tensor w = grads ? want[i].second.grad() : want[i].second;
    EXPECT_TRUE(testing::all_close(got[i], w, atol, rtol))
        << (grads ? "grad of " : "") << want[i].first;
  }
}

TEST(DlrmParallel, FewStepsMatchOneProcess) {
  REQUIRE_SHARED_FILE(dir, "ml-100k/u.data");
  const int64_t W = world()->size(), B = 128;
  MovieLens ml = loader(dir.parent_path(), B, world()->rank(), W);
  MovieLens ref_ml = loader(dir.parent_path(), B * W, 0, 1);
  const ModelArgs args = movielens_args(rt::sparse::GradientMode::Fused);
  auto model = std::make_shared<Dlrm>(args);
  auto ref = std::make_shared<Dlrm>(args);
  model->init_weights(42);
  ref->init_weights(42);
  DlrmParallelOptions opts;
  opts.group = world();
  opts.dp_mesh = dp_mesh();
  opts.plan = mixed_plan(args);
  const par::ShardingPlan plan = parallelize_dlrm(*model, opts);
  EXPECT_EQ(plan.at("t_user_id").type, par::ShardingType::RowWise);
  // The FQNs are kept (this rank's shards under the unsharded names).
  for (const auto& [name, t] : model->named_parameters()) {
    if (name.rfind("sparse_arch.", 0) == 0) {
      EXPECT_EQ(name.substr(name.size() - 7), ".weight");
      EXPECT_EQ(name.rfind("sparse_arch.embedding_bags.t_", 0), 0u) << name;
    }
  }
  // SGD for the dense layers here: Adam's first steps move every weight by ~lr whatever its
  // gradient's size, so a near-zero gradient rounded to the other sign would move a weight the
  // other way (see MovieLensAucEqualsOneRank); SGD keeps rounding differences at rounding size.
  rt::optim::SGD opt(model->dense_parameters(), {.lr = 0.5, .momentum = 0.9});
  rt::optim::SGD ref_opt(ref->dense_parameters(), {.lr = 0.5, .momentum = 0.9});
  for (int step = 0; step < 5; ++step) {
    const RecsysBatch b = ml.next();
    const RecsysBatch gb = ref_ml.next();
    ASSERT_EQ(b.size(), B);
    opt.zero_grad();
    ref_opt.zero_grad();
    const int64_t G = global_batch_size(*world(), b.size());
    ASSERT_EQ(G, B * W);
    const Tensor loss = data_parallel_bce_loss((*model)(b.dense, b.sparse), b.labels, G);
    loss.backward();
    const Tensor ref_loss = bce_with_logits((*ref)(gb.dense, gb.sparse), gb.labels);
    ref_loss.backward();
    EXPECT_NEAR(sum_over_ranks(loss.item<double>()), ref_loss.item<double>(), 1e-5)
        << "step " << step;
    {
      SCOPED_TRACE("step " + std::to_string(step));
      expect_dense_match(*model, *ref, /*grads=*/true, 1e-7, 1e-5);
    }
    opt.step();
    ref_opt.step();
    SCOPED_TRACE("after step " + std::to_string(step));
    expect_rows_match(*model, *ref, 1e-6);
    expect_dense_match(*model, *ref, /*grads=*/false, 1e-6, 1e-5);
  }
  // Parallelizing twice is refused.
  EXPECT_THROW(parallelize_dlrm(*model, opts), mt::Error);
}

// Held-out logits of every test sample, by rating index (collective: each rank scores its rows).
std::vector<double> test_scores(Dlrm& model, const MovieLens& ml, bool collective) {
  model.eval();
  rt::NoGradGuard no_grad;
  std::vector<double> by_index(size_t(ml.num_ratings()), 0.0);
  for (int64_t k = 0; k < ml.num_test_batches(); ++k) {
    const RecsysBatch b = ml.test_batch(k);
    const auto s = model(b.dense, b.sparse).to_vector<double>();
    for (size_t i = 0; i < s.size(); ++i) by_index[size_t(b.samples[i])] = s[i];
  }
  model.train();
  if (collective) {
    Tensor t = rt::from_vector<double>(by_index, {int64_t(by_index.size())}, {rt::DType::F64});
    world()->all_reduce(t, par::ReduceOp::Sum, "test.scores");
    by_index = t.to_vector<double>();
  }
  std::vector<double> out;
  for (int64_t i : ml.test_indices()) out.push_back(by_index[size_t(i)]);
  return out;
}

std::vector<double> test_labels(const MovieLens& ml) {
  std::vector<double> out;
  for (int64_t i : ml.test_indices()) out.push_back(ml.ratings()[size_t(i)].rating >= 4 ? 1 : 0);
  return out;
}

// Options for the tables planned over `group` (user_id / item_id fixed row_wise, the planner
// places the rest) and FSDP over `mesh`.
DlrmParallelOptions planned(std::shared_ptr<par::ProcessGroup> group,
                            std::shared_ptr<par::DeviceMesh> mesh, int64_t batch_per_rank) {
  DlrmParallelOptions opts;
  opts.group = std::move(group);
  opts.dp_mesh = std::move(mesh);
  opts.planner.memory_budget_bytes = 1 << 20;
  opts.planner.batch_size_per_rank = batch_per_rank;
  opts.planner.constraints["t_user_id"].type = par::ShardingType::RowWise;
  opts.planner.constraints["t_item_id"].type = par::ShardingType::RowWise;
  return opts;
}

// Trains `model` for `steps` steps of `ml`'s batches (global batch `global`, the loss convention
// of parallelize.h: each rank's share of the global mean BCE) and returns the last global loss.
double train(Dlrm& model, MovieLens& ml, int64_t steps, int64_t global, par::ProcessGroup& group) {
  rt::optim::AdamW opt(model.dense_parameters(), {.lr = 3e-3, .weight_decay = 0.0});
  double last = 0.0;
  for (int64_t s = 0; s < steps; ++s) {
    const RecsysBatch b = ml.next();
    opt.zero_grad();
    const Tensor loss = data_parallel_bce_loss(model(b.dense, b.sparse), b.labels, global);
    loss.backward();
    opt.step();
    if (s == steps - 1) {
      Tensor t = rt::from_vector<double>({loss.item<double>()}, {1}, {rt::DType::F64});
      group.all_reduce(t, par::ReduceOp::Sum, "test.loss");
      last = t.item<double>();
    }
  }
  return last;
}

struct Diff {
  double mean = 0, max = 0;
};
Diff diff(const std::vector<double>& a, const std::vector<double>& b) {
  Diff d;
  for (size_t i = 0; i < a.size(); ++i) {
    d.max = std::max(d.max, std::abs(a[i] - b[i]));
    d.mean += std::abs(a[i] - b[i]) / double(a.size());
  }
  return d;
}

TEST(DlrmParallel, MovieLensAucEqualsOneRank) {
  REQUIRE_SHARED_FILE(dir, "ml-100k/u.data");
  const auto start = std::chrono::steady_clock::now();
  const int64_t W = world()->size(), global = 1024, B = global / W;
  const ModelArgs args = movielens_args(rt::sparse::GradientMode::Fused);
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // Every rank its own 1-rank group (collective split), for rank 0's 1-rank runs.
  std::shared_ptr<par::ProcessGroup> self(world()->split(world()->rank(), 0));

  // The 1-rank runs, by rank 0 alone (the others wait at the broadcast): the model parallelized
  // over a 1-rank group (every table on rank 0, FSDP over one rank: the same code path), and the
  // plain unparallelized model (the unsharded EmbeddingBagCollection, dlrm_test's path).
  MovieLens ref_ml = loader(dir.parent_path(), global, 0, 1);
  const int64_t steps = int64_t(ref_ml.train_indices().size()) / global;  // one epoch
  const std::vector<double> labels = test_labels(ref_ml);
  const size_t n = labels.size();
  std::vector<double> one(2 * n, 0.0);  // 1-rank parallelized, then plain
  if (world()->rank() == 0) {
    auto mesh1 = par::DeviceMesh::create(self, {1}, {"dp_shard"});
    auto ref = std::make_shared<Dlrm>(args);
    ref->init_weights(42);
    parallelize_dlrm(*ref, planned(self, mesh1, global));
    train(*ref, ref_ml, steps, global, *self);
    const auto s1 = test_scores(*ref, ref_ml, /*collective=*/false);
    MovieLens plain_ml = loader(dir.parent_path(), global, 0, 1);
    auto plain = std::make_shared<Dlrm>(args);
    plain->init_weights(42);
    train(*plain, plain_ml, steps, global, *self);
    const auto s2 = test_scores(*plain, plain_ml, /*collective=*/false);
    std::copy(s1.begin(), s1.end(), one.begin());
    std::copy(s2.begin(), s2.end(), one.begin() + int64_t(n));
  }
  {
    Tensor t = rt::from_vector<double>(one, {int64_t(one.size())}, {rt::DType::F64});
    world()->broadcast(t, 0, "test.ref_scores");
    one = t.to_vector<double>();
  }
  const std::vector<double> ref_scores(one.begin(), one.begin() + int64_t(n));
  const std::vector<double> plain_scores(one.begin() + int64_t(n), one.end());
  const double ref_time = seconds();

  // The same schedule on W ranks: B samples per rank.
  MovieLens ml = loader(dir.parent_path(), B, world()->rank(), W);
  auto model = std::make_shared<Dlrm>(args);
  model->init_weights(42);
  const par::ShardingPlan plan = parallelize_dlrm(*model, planned(world(), dp_mesh(), B));
  if (world()->rank() == 0) std::printf("%s", plan.describe(args.table_configs()).c_str());
  const double last_loss = train(*model, ml, steps, global, *world());
  const std::vector<double> scores = test_scores(*model, ml, /*collective=*/true);

  const double auc = roc_auc(scores, labels);
  const double ref_auc = roc_auc(ref_scores, labels);
  const double plain_auc = roc_auc(plain_scores, labels);
  const Diff d = diff(scores, ref_scores), dp = diff(scores, plain_scores);
  if (world()->rank() == 0) {
    std::printf(
        "MovieLens 100K, %lld steps of %lld (one epoch), last loss %.4f: held-out AUC %.6f on "
        "%lld ranks, %.6f on 1 rank (logits: mean |diff| %.2e, max %.2e), %.6f unparallelized "
        "(logits: mean |diff| %.2e, max %.2e); 1-rank runs %.1f s, total %.1f s\n",
        (long long)steps, (long long)global, last_loss, auc, (long long)W, ref_auc, d.mean, d.max,
        plain_auc, dp.mean, dp.max, ref_time, seconds());
  }
  // The 1-rank parallelized run is the unparallelized one (same sums in the same order).
  EXPECT_LT(diff(ref_scores, plain_scores).max, 1e-6);
  // N ranks vs 1 rank: the sums run in another order (over ranks), and rounding grows over the
  // epoch: the logits agree to ~1e-7 for the first steps, then now and then a gradient that is
  // ~0 rounds to the other sign, and Adam (dense) or row-wise Adagrad on a row's first touch moves
  // the weight by ~lr whatever the gradient's size; the runs drift apart by ~1e-2 in the logits
  // (measured: 2 and 4 ranks stay within ~1e-6 of each other, mean |diff| to 1 rank 8e-3). With
  // SGD the steps match tightly (FewStepsMatchOneProcess). The AUC agrees to ~5e-5.
  EXPECT_NEAR(auc, ref_auc, 2e-4);
  EXPECT_LT(d.mean, 2e-2);
  EXPECT_GT(auc, 0.75);
}

TEST(DlrmParallel, RowSparseClipNormEqualsOneProcess) {
  REQUIRE_SHARED_FILE(dir, "ml-100k/u.data");
  const int64_t W = world()->size(), B = 64;
  MovieLens ml = loader(dir.parent_path(), B, world()->rank(), W);
  MovieLens ref_ml = loader(dir.parent_path(), B * W, 0, 1);
  const ModelArgs args = movielens_args(rt::sparse::GradientMode::RowSparse);
  auto model = std::make_shared<Dlrm>(args);
  auto ref = std::make_shared<Dlrm>(args);
  model->init_weights(7);
  ref->init_weights(7);
  DlrmParallelOptions opts;
  opts.group = world();
  opts.dp_mesh = dp_mesh();
  opts.plan = mixed_plan(args);
  parallelize_dlrm(*model, opts);
  auto& tables = dynamic_cast<ShardedSparseArch&>(model->sparse_arch()).collection();
  auto& ref_tables = dynamic_cast<EmbeddingBagSparseArch&>(ref->sparse_arch()).collection();
  rt::optim::SGD opt(model->dense_parameters(), {.lr = 0.5, .momentum = 0.9});
  rt::optim::SGD ref_opt(ref->dense_parameters(), {.lr = 0.5, .momentum = 0.9});
  for (int step = 0; step < 3; ++step) {
    const RecsysBatch b = ml.next();
    const RecsysBatch gb = ref_ml.next();
    opt.zero_grad();
    ref_opt.zero_grad();
    data_parallel_bce_loss((*model)(b.dense, b.sparse), b.labels, B * W).backward();
    bce_with_logits((*ref)(gb.dense, gb.sparse), gb.labels).backward();

    // The 1-process norm written out: dense gradients and the tables' row-sparse gradients.
    std::vector<Tensor> ref_dense;
    for (const auto& [name, t] : ref->dense_parameters()) ref_dense.push_back(t);
    const double dense2 = rt::optim::local_norm_pow(ref_dense, 2.0);
    const double tables2 = rt::sparse::row_sparse_norm_pow(ref_tables.sparse_grads(), 2.0);
    ASSERT_GT(tables2, 0.0);
    const double want = std::sqrt(dense2 + tables2);
    const double want_inf =
        std::max(rt::optim::local_norm_pow(ref_dense, INFINITY),
                 rt::sparse::row_sparse_norm_pow(ref_tables.sparse_grads(), INFINITY));
    EXPECT_NEAR(dlrm_total_grad_norm(*model), want, 1e-5 * want);
    EXPECT_NEAR(dlrm_total_grad_norm(*model, INFINITY), want_inf, 1e-5 * want_inf);
    EXPECT_NEAR(dlrm_total_grad_norm(*ref), want, 1e-9 * want);  // the unsharded path too

    // Clip to half the norm: both scale dense and table gradients alike.
    const double got = clip_dlrm_grad_norm_(*model, want / 2);
    const double ref_got = clip_dlrm_grad_norm_(*ref, want / 2);
    EXPECT_NEAR(got, want, 1e-5 * want);
    EXPECT_NEAR(ref_got, want, 1e-9 * want);
    EXPECT_NEAR(dlrm_total_grad_norm(*model), want / 2, 1e-4 * want);
    expect_dense_match(*model, *ref, /*grads=*/true, 1e-6, 1e-4);
    opt.step();
    ref_opt.step();
    tables.apply_sparse_grads();
    ref_tables.apply_sparse_grads();
  }
  expect_rows_match(*model, *ref, 1e-5);
  expect_dense_match(*model, *ref, /*grads=*/false, 1e-5, 1e-4);
}

}  // namespace
}  // namespace mt::models::dlrm
