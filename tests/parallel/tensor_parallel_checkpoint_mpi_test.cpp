// Checkpoints across tensor-parallel layouts (mpirun -np 2 and 4): a Llama trained one step under
// one layout of (dp_shard, tp) and saved loads under every other layout with each rank's pieces
// bitwise equal to the saved whole tensors' regions, and saving it again gives bitwise the same
// tensors. Layouts: on 2 ranks TP 2 <-> FSDP 2; on 4 ranks FSDP 2 x TP 2 -> TP 4 and -> FSDP 4,
// TP 4 -> FSDP 2 x TP 2, and FSDP 4 -> TP 4. The loaded model starts from other initial weights, so a load that
// did nothing fails.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/consolidate.h"
#include "checkpoint/distributed_checkpoint.h"
#include "models/llama/model.h"
#include "models/llama/parallelize.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/tensor/dtensor_ops.h"
#include "runtime/core/grad_mode.h"
#include "runtime/core/rng.h"
#include "runtime/nn/init.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "tests/testing/mpi_fixtures.h"

namespace mt::parallel {
namespace {

namespace fs = std::filesystem;
using runtime::Tensor;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(MpiProcessGroup::world());
  return pg;
}

models::llama::ModelArgs args() {
  models::llama::ModelArgs a;
  a.dim = 64;
  a.n_layers = 2;
  a.n_heads = 4;
  a.n_kv_heads = 4;
  a.vocab_size = 97;  // uneven over 2 and 4 ranks
  a.multiple_of = 32;
  a.max_seq_len = 16;
  a.rope_scaling.reset();
  return a;
}

struct Parallel {
  std::shared_ptr<models::llama::Transformer> model;
  models::ParallelContext ctx;
};

// A model built without values, split over (dp_shard = world / tp, tp), drawn from `seed`.
Parallel build(int64_t tp, uint64_t seed) {
  Parallel p;
  {
    runtime::nn::DeferredInitGuard no_values;
    p.model = std::make_shared<models::llama::Transformer>(args(), seed);
  }
  const int64_t dp = world()->size() / tp;
  auto mesh = DeviceMesh::create(world(), {dp, tp}, {"dp_shard", "tp"});
  p.ctx.dp_mesh = mesh->submesh({"dp_shard"});
  p.ctx.gradient_divide_factor = 1.0;
  if (tp > 1) {
    p.ctx.world_mesh = mesh;
    p.ctx.tp_mesh = mesh->submesh({"tp"});
  }
  models::llama::parallelize(*p.model, p.ctx);
  init_sharded_parameters(*p.model, seed);
  return p;
}

// One SGD step (lr 0.1) on a fixed batch of 4 sequences, each dp rank its rows.
void train_step(Parallel& p, int64_t tp) {
  const int64_t dp = world()->size() / tp, rows = 4 / dp, dp_rank = world()->rank() / tp;
  Tensor u = runtime::rand({4, 9}, runtime::RandomKey(5, "tp_checkpoint.tokens"));
  Tensor tokens = runtime::mul(u, 96.99).to(runtime::DType::I64).narrow(0, dp_rank * rows, rows);
  const Tensor inputs = tokens.narrow(1, 0, 8).contiguous();
  const Tensor targets = tokens.narrow(1, 1, 8).contiguous();
  const Tensor logits = p.model->loss_logits(inputs);
  const Tensor loss = tp > 1 ? dtensor::vocab_parallel_cross_entropy(logits, targets, p.ctx.tp_mesh,
                                                                     97, -100, runtime::Reduction::Sum)
                             : runtime::cross_entropy(logits, targets, -100, runtime::Reduction::Sum);
  runtime::mul(loss, 1.0 / 32.0).backward();
  runtime::NoGradGuard no_grad;
  for (const Tensor& w : p.model->parameters()) runtime::add_(w, w.grad(), -0.1);
}

checkpoint::CheckpointState state_of(Parallel& p) {
  checkpoint::CheckpointState state;
  for (const auto& d : distributed_parameters(*p.model)) {
    EXPECT_NE(d.dtensor, nullptr) << d.fqn;
    state.tensors.push_back({d.fqn, d.param, d.dtensor->global_shape, d.dtensor->local_offset});
  }
  return state;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// Saves under tp_from after a step, loads under tp_to, checks the pieces and a second save.
void expect_reshards(const std::string& name, int64_t tp_from, int64_t tp_to) {
  SCOPED_TRACE(name);
  const fs::path dir = testing::shared_dir(*world(), "mt_tp_checkpoint", name);
  Parallel saved = build(tp_from, 1);
  train_step(saved, tp_from);
  checkpoint::save_checkpoint(dir / "saved", state_of(saved), *world());

  Parallel loaded = build(tp_to, 2);  // other initial values: the load must replace them
  checkpoint::CheckpointState dest = state_of(loaded);
  ASSERT_EQ(dest.tensors.size(), size_t(3 + 9 * args().n_layers));  // every parameter, none tied
  checkpoint::load_checkpoint(dir / "saved", dest, *world());
  for (const checkpoint::TensorPiece& piece : dest.tensors) {
    const Tensor whole = checkpoint::read_whole_tensor(dir / "saved", piece.fqn);
    Tensor region = whole;
    for (size_t d = 0; d < piece.global_offset.size(); ++d)
      region = region.narrow(int64_t(d), piece.global_offset[d], piece.local.size(int64_t(d)));
    EXPECT_TRUE(same_bytes(piece.local, region)) << piece.fqn << " on rank " << world()->rank();
  }
  checkpoint::save_checkpoint(dir / "again", state_of(loaded), *world());
  world()->barrier("tp_checkpoint.saved");
  if (world()->rank() == 0) {
    for (const auto& d : distributed_parameters(*saved.model)) {
      EXPECT_TRUE(same_bytes(checkpoint::read_whole_tensor(dir / "saved", d.fqn),
                             checkpoint::read_whole_tensor(dir / "again", d.fqn)))
          << d.fqn;
    }
  }
  world()->barrier("tp_checkpoint.end");
}

TEST(TensorParallelCheckpoint, WeightsReshardBitwiseAcrossLayouts) {
  if (world()->size() == 2) {
    expect_reshards("tp2_to_fsdp2", 2, 1);
    expect_reshards("fsdp2_to_tp2", 1, 2);
  } else {
    ASSERT_EQ(world()->size(), 4);
    expect_reshards("fsdp2xtp2_to_tp4", 2, 4);
    expect_reshards("fsdp2xtp2_to_fsdp4", 2, 1);
    expect_reshards("tp4_to_fsdp2xtp2", 4, 2);
    expect_reshards("fsdp4_to_tp4", 1, 4);
  }
}

}  // namespace
}  // namespace mt::parallel
