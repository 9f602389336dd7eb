// DLRM on the GPU against the CPU (models/dlrm): the same model, parallelized on one rank with
// its tables and dense layers on the GPU (parallelize_dlrm's device), trains like the CPU one
// (logits, losses, clip norms, dense and table weights, the tables' optimizer state) for the dot
// and DCN interactions in both table gradient modes; an unsharded model moved with Module::to
// takes host inputs too. Skips without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "models/dlrm/metrics.h"
#include "models/dlrm/model.h"
#include "models/dlrm/parallelize.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/ops/factory.h"
#include "runtime/optim/adamw.h"
#include "tests/testing/gpu.h"
#include "tests/testing/tensor_testing.h"

namespace mt::models::dlrm {
namespace {

namespace rt = mt::runtime;
namespace par = mt::parallel;
using rt::Device;
using rt::DType;
using rt::sparse::GradientMode;
using rt::sparse::KeyedJaggedTensor;

std::shared_ptr<par::ProcessGroup> world() {
  static std::shared_ptr<par::ProcessGroup> pg(par::MpiProcessGroup::world());
  return pg;
}

ModelArgs args_for(InteractionType interaction, GradientMode mode) {
  ModelArgs a;
  a.num_dense = 5;
  a.features = {{"f0", 50}, {"f1", 9}, {"f2", 300}};
  a.embedding_dim = 8;
  a.bottom_mlp = {16, 8};
  a.top_mlp = {12, 1};
  a.interaction = interaction;
  a.dcn_num_layers = 2;
  a.dcn_low_rank = 4;
  a.table_optimizer.type = rt::sparse::EmbOptimType::RowwiseAdagrad;
  a.table_optimizer.lr = 0.05;
  a.gradient_mode = mode;
  return a;
}

// B samples of the three features, bags of 0-3 ids (repeats included), different every step.
KeyedJaggedTensor batch_ids(const ModelArgs& a, int64_t batch, int step) {
  std::vector<int64_t> values, lengths;
  for (size_t f = 0; f < a.features.size(); ++f) {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = (b * 5 + step + int64_t(f)) % 4;
      for (int64_t k = 0; k < len; ++k)
        values.push_back((b * 31 + k * 7 + step * 13 + int64_t(f)) % a.features[f].num_embeddings);
      lengths.push_back(len);
    }
  }
  return KeyedJaggedTensor::from_lengths({"f0", "f1", "f2"}, values, lengths);
}

// One model trained `steps` steps on `device` (tables sharded on one rank, AdamW on the dense
// parameters, clipping at 1.0): the per-step losses and clip norms, and the model.
struct TrainedRun {
  std::vector<double> losses, norms;
  std::shared_ptr<Dlrm> model;
};

TrainedRun train_on(Device device, const ModelArgs& args, int steps) {
  TrainedRun run;
  run.model = std::make_shared<Dlrm>(args);
  run.model->init_weights(11);
  DlrmParallelOptions opts;
  opts.group = world();
  opts.planner.memory_budget_bytes = 16 << 20;
  opts.device = device;
  parallelize_dlrm(*run.model, opts);
  std::vector<Tensor> dense;
  for (auto& [name, p] : run.model->dense_parameters()) dense.push_back(p);
  rt::optim::AdamW opt(dense, {.lr = 1e-2, .weight_decay = 0.0});
  const int64_t batch = 24;
  for (int step = 0; step < steps; ++step) {
    const Tensor x = testing::randn_as({batch, args.num_dense}, DType::F32, uint64_t(100 + step));
    std::vector<float> y(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) y[size_t(b)] = float((b + step) % 3 == 0);
    const Tensor labels =
        rt::from_vector<float>(y, {batch}, rt::TensorOptions{}.with_device(device));
    opt.zero_grad();
    const Tensor logits = (*run.model)(x, batch_ids(args, batch, step));  // host inputs
    EXPECT_EQ(logits.device(), device);
    const Tensor loss = data_parallel_bce_loss(logits, labels, batch);
    loss.backward();
    run.norms.push_back(clip_dlrm_grad_norm_(*run.model, 1.0));
    opt.step();
    if (args.gradient_mode == GradientMode::RowSparse)
      dynamic_cast<ShardedSparseArch&>(run.model->sparse_arch()).collection().apply_sparse_grads();
    run.losses.push_back(loss.item<double>());
  }
  return run;
}

TEST(DlrmGpu, ParallelizedOnOneRankTrainsAsOnCpu) {
  MT_REQUIRE_CUDA();
  ASSERT_EQ(world()->size(), 1) << "run without mpirun";
  for (auto interaction : {InteractionType::Dot, InteractionType::Dcn}) {
    for (auto mode : {GradientMode::Fused, GradientMode::RowSparse}) {
      SCOPED_TRACE(::testing::Message()
                   << (interaction == InteractionType::Dot ? "dot" : "dcn")
                   << (mode == GradientMode::Fused ? " fused" : " row_sparse"));
      const ModelArgs args = args_for(interaction, mode);
      const TrainedRun cpu = train_on(Device::cpu(), args, 6);
      const TrainedRun gpu = train_on(Device::cuda(), args, 6);
      EXPECT_EQ(gpu.model->device(), Device::cuda());
      for (size_t s = 0; s < cpu.losses.size(); ++s) {
        EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * (1 + cpu.losses[s])) << "step " << s;
        EXPECT_NEAR(gpu.norms[s], cpu.norms[s], 1e-4 * (1 + cpu.norms[s])) << "step " << s;
      }
      const auto pc = cpu.model->named_parameters(), pg = gpu.model->named_parameters();
      ASSERT_EQ(pc.size(), pg.size());
      for (size_t i = 0; i < pc.size(); ++i) {
        EXPECT_EQ(pg[i].first, pc[i].first);
        EXPECT_EQ(pg[i].second.device(), Device::cuda()) << pg[i].first;
        EXPECT_REL_NEAR(pg[i].second, pc[i].second, 1e-4) << pg[i].first;
      }
      auto& tables_c = dynamic_cast<ShardedSparseArch&>(cpu.model->sparse_arch()).collection();
      auto& tables_g = dynamic_cast<ShardedSparseArch&>(gpu.model->sparse_arch()).collection();
      const auto sc = tables_c.optimizer_state_dict(), sg = tables_g.optimizer_state_dict();
      ASSERT_EQ(sc.size(), sg.size());
      for (const auto& [key, value] : sc) EXPECT_REL_NEAR(sg.at(key), value, 1e-4) << key;
    }
  }
}

// The unsharded model moved with Module::to: host dense features and ids give the CPU's logits.
TEST(DlrmGpu, UnshardedModelOnTheGpuTakesHostInputs) {
  MT_REQUIRE_CUDA();
  for (auto interaction : {InteractionType::Dot, InteractionType::Dcn}) {
    const ModelArgs args = args_for(interaction, GradientMode::Fused);
    Dlrm cpu(args), gpu(args);
    cpu.init_weights(4);
    gpu.init_weights(4);
    gpu.to(Device::cuda());
    EXPECT_EQ(gpu.device(), Device::cuda());
    const Tensor x = testing::randn_as({7, args.num_dense}, DType::F32, 9);
    const KeyedJaggedTensor ids = batch_ids(args, 7, 1);
    EXPECT_REL_NEAR(gpu(x, ids), cpu(x, ids), 1e-5);
    EXPECT_REL_NEAR(gpu(testing::on_cuda(x), ids), cpu(x, ids), 1e-5);
  }
}

}  // namespace
}  // namespace mt::models::dlrm
