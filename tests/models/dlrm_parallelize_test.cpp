// parallelize_dlrm in one process (models/dlrm/parallelize.h; the multi-rank runs are in
// dlrm_mpi_test): a Dlrm parallelized over a 1-rank group (every table on rank 0, FSDP over one
// rank: the path a 1-rank trainer takes) keeps its FQNs and trains exactly like the plain model
// (dot and DCN interactions); the errors name the problem; set_sparse_arch checks table names;
// in RowSparse mode the one-process clip norm counts the tables' sparse gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "models/dlrm/metrics.h"
#include "models/dlrm/model.h"
#include "models/dlrm/parallelize.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/ops/factory.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/optim/sgd.h"
#include "runtime/sparse/row_sparse_grad.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::models::dlrm {
namespace {

namespace rt = mt::runtime;
namespace par = mt::parallel;
using rt::DType;

std::shared_ptr<par::ProcessGroup> world() {
  static std::shared_ptr<par::ProcessGroup> pg(par::MpiProcessGroup::world());
  return pg;
}

ModelArgs small_args(InteractionType interaction, rt::sparse::GradientMode mode) {
  ModelArgs a;
  a.num_dense = 3;
  a.features = {{"f0", 10}, {"f1", 7}};
  a.embedding_dim = 4;
  a.bottom_mlp = {5, 4};
  a.top_mlp = {6, 1};
  a.interaction = interaction;
  a.dcn_num_layers = 2;
  a.dcn_low_rank = 3;
  a.table_optimizer.type = rt::sparse::EmbOptimType::RowwiseAdagrad;
  a.table_optimizer.lr = 0.1;
  a.gradient_mode = mode;
  return a;
}

rt::sparse::KeyedJaggedTensor small_kjt(int step) {
  // 3 samples; f0 bags {1, 2}, {}, {9 - step}; f1 bags {step}, {6, 6}, {3}.
  return rt::sparse::KeyedJaggedTensor::from_lengths({"f0", "f1"}, {1, 2, 9 - step, step, 6, 6, 3},
                                                     {2, 0, 1, 1, 2, 1});
}

DlrmParallelOptions one_rank_options() {
  DlrmParallelOptions opts;
  opts.group = world();
  opts.dp_mesh = par::DeviceMesh::create(world(), {1}, {"dp_shard"});
  opts.planner.memory_budget_bytes = 1 << 20;
  return opts;
}

TEST(DlrmParallelizeTest, OneRankTrainsLikeThePlainModel) {
  ASSERT_EQ(world()->size(), 1) << "run without mpirun";
  for (auto type : {InteractionType::Dot, InteractionType::Dcn}) {
    const ModelArgs args = small_args(type, rt::sparse::GradientMode::Fused);
    auto plain = std::make_shared<Dlrm>(args);
    auto model = std::make_shared<Dlrm>(args);
    plain->init_weights(5);
    model->init_weights(5);
    const auto names_before = model->named_parameters();
    const par::ShardingPlan plan = parallelize_dlrm(*model, one_rank_options());
    EXPECT_EQ(plan.world_size, 1);
    EXPECT_NE(dynamic_cast<ShardedSparseArch*>(&model->sparse_arch()), nullptr);
    const auto names_after = model->named_parameters();
    ASSERT_EQ(names_after.size(), names_before.size());
    for (size_t i = 0; i < names_after.size(); ++i) {
      EXPECT_EQ(names_after[i].first, names_before[i].first);
      // The shards (whole tables on one rank) hold the values drawn before.
      EXPECT_TRUE(testing::all_close(names_after[i].second, names_before[i].second, 0, 0))
          << names_after[i].first;
    }
    rt::optim::SGD opt(model->dense_parameters(), {.lr = 0.3});
    rt::optim::SGD plain_opt(plain->dense_parameters(), {.lr = 0.3});
    const Tensor labels = rt::from_vector<float>({1, 0, 1}, {3});
    for (int step = 0; step < 3; ++step) {
      const Tensor dense = testing::randn_as({3, 3}, DType::F32, uint64_t(10 + step));
      opt.zero_grad();
      plain_opt.zero_grad();
      const Tensor logits = (*model)(dense, small_kjt(step));
      const Tensor want = (*plain)(dense, small_kjt(step));
      EXPECT_TRUE(testing::all_close(logits, want, 1e-6, 1e-6)) << "step " << step;
      const Tensor loss = data_parallel_bce_loss(logits, labels, global_batch_size(*world(), 3));
      const Tensor want_loss = bce_with_logits(want, labels);
      EXPECT_NEAR(loss.item<double>(), want_loss.item<double>(), 1e-6);
      loss.backward();
      want_loss.backward();
      opt.step();
      plain_opt.step();
    }
    const auto got = model->named_parameters(), ref = plain->named_parameters();
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(testing::all_close(got[i].second, ref[i].second, 1e-6, 1e-5)) << got[i].first;
    }
    // Parallelizing twice is refused.
    EXPECT_NE(testing::error_of([&] { parallelize_dlrm(*model, one_rank_options()); })
                  .find("already ShardedSparseArch"),
              std::string::npos);
  }
}

TEST(DlrmParallelizeTest, ErrorsNameTheProblem) {
  const ModelArgs args = small_args(InteractionType::Dot, rt::sparse::GradientMode::Fused);
  auto model = std::make_shared<Dlrm>(args);
  DlrmParallelOptions no_group;
  EXPECT_NE(testing::error_of([&] { parallelize_dlrm(*model, no_group); }).find("options.group"),
            std::string::npos);
  DlrmParallelOptions tight = one_rank_options();
  tight.planner.memory_budget_bytes = 64;  // nothing fits
  EXPECT_NE(testing::error_of([&] { parallelize_dlrm(*model, tight); }).find("t_f0"),
            std::string::npos);
  auto dense_mode = std::make_shared<Dlrm>(small_args(InteractionType::Dot,
                                                      rt::sparse::GradientMode::Dense));
  EXPECT_NE(testing::error_of([&] { parallelize_dlrm(*dense_mode, one_rank_options()); })
                .find("GradientMode::Dense is not supported"),
            std::string::npos);
  // The model is left as it was by a failed call.
  EXPECT_NE(dynamic_cast<EmbeddingBagSparseArch*>(&model->sparse_arch()), nullptr);
  // set_sparse_arch: tables of another model are refused, naming the parameter.
  rt::sparse::EmbeddingBagConfig other;
  other.name = "t_other";
  other.num_embeddings = 4;
  other.embedding_dim = 4;
  other.feature_names = {"f0"};
  auto arch = std::make_shared<EmbeddingBagSparseArch>(
      std::make_shared<rt::sparse::EmbeddingBagCollection>(
          std::vector<rt::sparse::EmbeddingBagConfig>{other}));
  EXPECT_NE(testing::error_of([&] { model->set_sparse_arch(arch); })
                .find("'embedding_bags.t_other.weight' is not one of the model's tables"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { model->set_sparse_arch(nullptr); }).find("null"),
            std::string::npos);
}

TEST(DlrmParallelizeTest, RowSparseClipNormCountsTheTables) {
  const ModelArgs args = small_args(InteractionType::Dcn, rt::sparse::GradientMode::RowSparse);
  auto model = std::make_shared<Dlrm>(args);
  model->init_weights(3);
  const Tensor dense = testing::randn_as({3, 3}, DType::F32, 4);
  bce_with_logits((*model)(dense, small_kjt(0)), rt::from_vector<float>({0, 1, 1}, {3}))
      .backward();
  auto& tables = dynamic_cast<EmbeddingBagSparseArch&>(model->sparse_arch()).collection();
  std::vector<Tensor> dense_params;
  for (const auto& [name, t] : model->dense_parameters()) dense_params.push_back(t);
  const double d2 = rt::optim::local_norm_pow(dense_params);
  const double t2 = rt::sparse::row_sparse_norm_pow(tables.sparse_grads());
  ASSERT_GT(t2, 0.0);
  const double want = std::sqrt(d2 + t2);
  EXPECT_NEAR(dlrm_total_grad_norm(*model), want, 1e-9 * want);
  EXPECT_NEAR(clip_dlrm_grad_norm_(*model, want / 4), want, 1e-9 * want);
  EXPECT_NEAR(dlrm_total_grad_norm(*model), want / 4, 1e-5 * want);
  EXPECT_NEAR(rt::sparse::row_sparse_norm_pow(tables.sparse_grads()), t2 / 16, 1e-5 * t2);
  // Fused tables are left out: the norm is the dense one.
  auto fused = std::make_shared<Dlrm>(small_args(InteractionType::Dcn, rt::sparse::GradientMode::Fused));
  fused->init_weights(3);
  bce_with_logits((*fused)(dense, small_kjt(0)), rt::from_vector<float>({0, 1, 1}, {3}))
      .backward();
  std::vector<Tensor> fused_dense;
  for (const auto& [name, t] : fused->dense_parameters()) fused_dense.push_back(t);
  EXPECT_NEAR(dlrm_total_grad_norm(*fused), rt::optim::total_grad_norm(fused_dense), 1e-9);
}

}  // namespace
}  // namespace mt::models::dlrm
