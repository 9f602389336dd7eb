// FSDP on real ranks (mpirun -np 2 and -np 4): N ranks against one process.
//
// Every rank also computes the single-process reference itself (the same model, seed and global
// batch, without FSDP), so each check compares the sharded run with it directly.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "models/llama/model.h"
#include "models/llama/parallelize.h"
#include "models/registry.h"
#include "parallel/clip_grad.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/core/rng.h"
#include "runtime/nn/init.h"
#include "runtime/nn/linear.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/reduce.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/clip_grad.h"
#include "tests/testing/tensor_testing.h"

namespace mt::parallel {
namespace {

using models::llama::ModelArgs;
using models::llama::Transformer;
using runtime::DType;
using runtime::Shape;
using runtime::TensorOptions;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(MpiProcessGroup::world());
  return pg;
}

std::shared_ptr<DeviceMesh> mesh_1d() {
  return DeviceMesh::create(world(), {world()->size()}, {"dp_shard"});
}

ModelArgs tiny_args() {
  ModelArgs a;
  a.dim = 32;
  a.n_layers = 2;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.vocab_size = 61;  // odd: uneven shards of the embedding and output
  a.multiple_of = 16;
  a.max_seq_len = 16;
  a.rope_theta = 10000.0;
  return a;
}

constexpr int64_t kBatch = 4, kSeq = 8;

// Global batch of step `step`: tokens [B, T+1]; two batches in turn, so the loss can fall.
Tensor global_batch(int step, int64_t vocab) {
  Tensor u = runtime::rand({kBatch, kSeq + 1}, runtime::RandomKey(7, "fsdp_test.batch", step % 2));
  return runtime::mul(u, double(vocab) - 1e-6).to(DType::I64);
}

struct Trace {
  std::vector<double> losses, norms;
};

struct RunConfig {
  std::shared_ptr<DeviceMesh> mesh;  // null: single process reference (no FSDP)
  std::shared_ptr<ProcessGroup> loss_group = world();  // sums the ranks' losses
  int64_t dp_rank = 0, dp_size = 1;  // this rank's slice of the global batch
  bool reshard_after_forward = true;
  bool activation_checkpointing = false;
  std::optional<DType> param_dtype;  // mixed precision (FSDP) / compute dtype
  int micro_batches = 1;
  int steps = 10;
};

// Trains the tiny llama: loss = sum of token losses / global token count (gradient divide factor
// 1), clip to 0.5 (it clips: the norms are larger), AdamW. Returns the global loss and norm.
Trace train(const RunConfig& cfg) {
  auto model = std::make_shared<Transformer>(tiny_args(), /*seed=*/3);
  model->set_activation_checkpointing({cfg.activation_checkpointing ? 1 : 0});
  if (cfg.mesh) {
    models::ParallelContext ctx;
    ctx.dp_mesh = cfg.mesh;
    ctx.reshard_after_forward = cfg.reshard_after_forward;
    ctx.mp_policy.param_dtype = cfg.param_dtype;
    ctx.mp_policy.reduce_dtype = DType::F32;
    models::llama::parallelize(*model, ctx);
  }
  runtime::optim::AdamW opt(model->named_parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  Trace trace;
  const double global_tokens = double(kBatch * kSeq);
  const int64_t local_batch = kBatch / cfg.dp_size;
  for (int step = 0; step < cfg.steps; ++step) {
    opt.zero_grad();
    Tensor batch = global_batch(step, tiny_args().vocab_size)
                       .narrow(0, cfg.dp_rank * local_batch, local_batch);
    double loss_sum = 0;
    const int64_t mb = local_batch / cfg.micro_batches;
    for (int m = 0; m < cfg.micro_batches; ++m) {
      Tensor part = batch.narrow(0, m * mb, mb);
      Tensor logits = (*model)(part.narrow(1, 0, kSeq).contiguous());
      Tensor loss = runtime::cross_entropy(logits, part.narrow(1, 1, kSeq).contiguous(), -100,
                                           runtime::Reduction::Sum);
      loss = runtime::mul(loss, 1.0 / global_tokens);
      loss.backward();
      loss_sum += loss.item<double>();
    }
    double norm = 0;
    if (cfg.mesh) {
      norm = clip_grad_norm_(distributed_parameters(*model), 0.5);
      Tensor l = runtime::from_vector<double>({loss_sum}, {1}, {DType::F64});
      cfg.loss_group->all_reduce(l, ReduceOp::Sum, "loss");
      loss_sum = l.item<double>();
    } else {
      norm = runtime::optim::clip_grad_norm_(model->parameters(), 0.5);
    }
    opt.step();
    trace.losses.push_back(loss_sum);
    trace.norms.push_back(norm);
  }
  return trace;
}

void expect_traces_near(const Trace& got, const Trace& want, double rtol) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], rtol * std::abs(want.losses[i])) << "step " << i;
    EXPECT_NEAR(got.norms[i], want.norms[i], rtol * std::abs(want.norms[i])) << "step " << i;
  }
  // The run actually trains and clips: otherwise agreement would prove little.
  const size_t last_even = (want.losses.size() - 1) / 2 * 2;  // the same batch as step 0
  EXPECT_LT(want.losses[last_even], want.losses.front());
  EXPECT_GT(want.norms.front(), 0.5);
}

const Trace& reference() {
  static Trace t = train({});
  return t;
}

// FSDP over every rank, each reading its rows of the global batch.
RunConfig fsdp_run(int steps) {
  RunConfig cfg;
  cfg.mesh = mesh_1d();
  cfg.dp_rank = world()->rank();
  cfg.dp_size = world()->size();
  cfg.steps = steps;
  return cfg;
}

// The first `steps` steps of the reference.
Trace reference_steps(int steps) {
  Trace want = reference();
  want.losses.resize(size_t(steps));
  want.norms.resize(size_t(steps));
  return want;
}

TEST(Fsdp, LlamaMatchesOneProcess) {
  expect_traces_near(train(fsdp_run(10)), reference(), 2e-5);
}

TEST(Fsdp, KeepingParamsGatheredAfterForwardChangesNothing) {
  RunConfig cfg = fsdp_run(3);
  cfg.reshard_after_forward = false;
  expect_traces_near(train(cfg), reference_steps(3), 2e-5);
}

TEST(Fsdp, ActivationCheckpointingAndMicroBatches) {
  if (kBatch / world()->size() < 2) GTEST_SKIP() << "needs 2 sequences per rank (np 2)";
  RunConfig cfg = fsdp_run(4);
  cfg.activation_checkpointing = true;
  cfg.micro_batches = 2;
  expect_traces_near(train(cfg), reference_steps(4), 2e-5);
}

TEST(Fsdp, HsdpTwoByTwoMatchesOneProcess) {
  if (world()->size() != 4) GTEST_SKIP() << "HSDP 2x2 needs 4 ranks";
  RunConfig cfg;
  cfg.mesh = DeviceMesh::create(world(), {2, 2}, {"dp_replicate", "dp_shard"});
  cfg.dp_rank = cfg.mesh->rank();
  cfg.dp_size = 4;
  expect_traces_near(train(cfg), reference(), 2e-5);
}

TEST(Fsdp, Bf16ParamsMatchOneProcessBf16) {
  // The one-process bf16 run: the same policy on a mesh of this rank alone.
  auto self = std::shared_ptr<ProcessGroup>(world()->split(world()->rank(), 0));
  RunConfig one;
  one.mesh = DeviceMesh::create(self, {1}, {"dp_shard"});
  one.loss_group = self;
  one.param_dtype = DType::BF16;
  one.steps = 5;
  const Trace want = train(one);
  RunConfig cfg = fsdp_run(one.steps);
  cfg.param_dtype = one.param_dtype;
  // bf16 compute: per-rank partial gradients round to bf16 before the f32 sum.
  expect_traces_near(train(cfg), want, 2e-2);
  // And bf16 compute is really used: it differs from the f32 run beyond f32 noise.
  double max_diff = 0;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(want.losses[i] - reference().losses[i]));
  }
  EXPECT_GT(max_diff, 1e-5);
}

TEST(Fsdp, ShardsAreTheRowsOfTheFullParameter) {
  auto model = std::make_shared<Transformer>(tiny_args(), 3);
  auto full = std::make_shared<Transformer>(tiny_args(), 3);
  auto mesh = mesh_1d();
  models::ParallelContext ctx;
  ctx.dp_mesh = mesh;
  models::llama::parallelize(*model, ctx);
  auto params = distributed_parameters(*model);
  auto want = full->named_parameters();
  ASSERT_EQ(params.size(), want.size());
  int64_t local = 0, total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_NE(params[i].dtensor, nullptr) << params[i].fqn;
    EXPECT_EQ(params[i].fqn, want[i].first);
    const DTensor& d = *params[i].dtensor;
    EXPECT_EQ(d.global_shape, want[i].second.shape());
    EXPECT_TRUE(d.local.same(params[i].param));
    const ChunkRange r = chunk_range(want[i].second.size(0), world()->size(), world()->rank());
    EXPECT_EQ(d.local.size(0), r.length) << params[i].fqn;
    EXPECT_TRUE(testing::all_close(d.local, want[i].second.narrow(0, r.offset, r.length), 0, 0));
    EXPECT_TRUE(testing::all_close(d.full_tensor(), want[i].second, 0, 0)) << params[i].fqn;
    local += d.local.numel();
    total += want[i].second.numel();
  }
  // Every element is held by exactly one rank.
  Tensor n = runtime::from_vector<int64_t>({local}, {1}, {DType::I64});
  world()->all_reduce(n, ReduceOp::Sum, "count");
  EXPECT_EQ(n.item<int64_t>(), total);
}

// Built without values, sharded, then each rank draws its shards: every parameter, gathered, is
// bitwise the whole model's init, though no rank ever held a whole parameter.
TEST(Fsdp, DeferredInitDrawsTheWholeInitShardByShard) {
  auto whole = std::make_shared<Transformer>(tiny_args(), 3);
  std::shared_ptr<Transformer> deferred;
  {
    runtime::nn::DeferredInitGuard no_values;
    deferred = std::make_shared<Transformer>(tiny_args(), 3);
  }
  for (const auto& [name, p] : deferred->named_parameters()) {
    EXPECT_FALSE(p.storage()->has_memory()) << name;
  }
  models::ParallelContext ctx;
  ctx.dp_mesh = mesh_1d();
  models::llama::parallelize(*deferred, ctx);
  init_sharded_parameters(*deferred, 3);
  const auto want = whole->named_parameters();
  const auto got = distributed_parameters(*deferred);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NE(got[i].dtensor, nullptr) << got[i].fqn;
    EXPECT_TRUE(testing::all_close(got[i].dtensor->full_tensor(), want[i].second, 0, 0))
        << got[i].fqn;
  }
  // Only what fully_shard manages can be drawn later: a model sharded in part is refused.
  std::shared_ptr<Transformer> partly;
  {
    runtime::nn::DeferredInitGuard no_values;
    partly = std::make_shared<Transformer>(tiny_args(), 3);
  }
  fully_shard(*partly->blocks[0], mesh_1d());
  try {
    init_sharded_parameters(*partly, 3);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'tok_embeddings.weight' is not sharded"),
              std::string::npos)
        << e.what();
  }
}

TEST(Fsdp, UnshardedMemoryIsFreedAfterForwardAndBackward) {
  auto model = std::make_shared<Transformer>(tiny_args(), 3);
  auto mesh = mesh_1d();
  std::vector<std::shared_ptr<FSDPModule>> blocks;
  for (const auto& b : model->blocks) blocks.push_back(fully_shard(*b, mesh));
  FullyShardOptions keep;
  keep.reshard_after_forward = false;
  auto root = fully_shard(*model, mesh, keep);
  auto all_freed = [](const FSDPModule& m) {
    for (const auto& p : m.group()->params()) {
      if (p->is_unsharded_allocated()) return false;
    }
    return m.group()->state() == FSDPParamGroup::State::Sharded;
  };
  auto slots_hold_shards = [&] {
    for (const auto& [fqn, p] : model->named_parameters()) {
      const int64_t rows = fqn == "tok_embeddings.weight" || fqn == "output.weight"
                               ? tiny_args().vocab_size
                               : (fqn.find("norm") != std::string::npos ? tiny_args().dim : -1);
      if (rows > 0 && p.size(0) != chunk_range(rows, world()->size(), world()->rank()).length) {
        return false;
      }
    }
    return true;
  };
  for (const auto& b : blocks) EXPECT_TRUE(all_freed(*b));
  Tensor tokens = global_batch(0, tiny_args().vocab_size).narrow(1, 0, kSeq).contiguous();
  Tensor logits = (*model)(tokens);
  for (const auto& b : blocks) EXPECT_TRUE(all_freed(*b));
  EXPECT_EQ(root->group()->state(), FSDPParamGroup::State::Unsharded);
  EXPECT_TRUE(slots_hold_shards());
  runtime::sum(logits).backward();
  for (const auto& b : blocks) EXPECT_TRUE(all_freed(*b));
  EXPECT_TRUE(all_freed(*root));
  EXPECT_TRUE(slots_hold_shards());
  for (const auto& [fqn, p] : model->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << fqn;
    EXPECT_EQ(p.grad().shape(), p.shape()) << fqn;
  }
  // A resharded parameter used outside its module says so instead of reading freed memory.
  EXPECT_THROW(blocks[0]->group()->params()[0]->unsharded().to_vector<float>(), Error);
}

// Two small layers whose output rows (3 and 1) leave some ranks with empty shards.
class TwoLayers : public runtime::nn::Module {
 public:
  TwoLayers() : Module("TwoLayers") {
    first = register_module("first", std::make_shared<runtime::nn::Linear>(5, 3));
    second = register_module("second", std::make_shared<runtime::nn::Linear>(3, 1));
    init_weights(11);
  }
  Tensor operator()(const Tensor& x) {
    return call({x}, [this](const std::vector<Tensor>& in) {
      return (*second)(runtime::tanh((*first)(in[0])));
    });
  }
  std::shared_ptr<runtime::nn::Linear> first, second;
};

TEST(Fsdp, EmptyShardsTrainLikeOneProcess) {
  auto ref = std::make_shared<TwoLayers>();
  auto model = std::make_shared<TwoLayers>();
  auto mesh = mesh_1d();
  fully_shard(*model->first, mesh);
  fully_shard(*model, mesh);  // the mean over ranks: each rank's loss is its local mean
  runtime::optim::AdamW ref_opt(ref->named_parameters(), {.lr = 0.1});
  runtime::optim::AdamW opt(model->named_parameters(), {.lr = 0.1});
  const int64_t w = world()->size(), rows = 2;
  for (int step = 0; step < 3; ++step) {
    Tensor x = runtime::randn({w * rows, 5}, runtime::RandomKey(5, "x", uint64_t(step)));
    ref_opt.zero_grad();
    opt.zero_grad();
    runtime::mean(runtime::square((*ref)(x))).backward();
    runtime::mean(runtime::square((*model)(x.narrow(0, world()->rank() * rows, rows)))).backward();
    ref_opt.step();
    opt.step();
  }
  auto params = distributed_parameters(*model);
  auto want = ref->named_parameters();
  ASSERT_EQ(params.size(), 4u);
  int64_t empty_shards = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    empty_shards += params[i].param.numel() == 0;
    EXPECT_TRUE(testing::all_close(params[i].dtensor->full_tensor(), want[i].second, 1e-6, 1e-5))
        << params[i].fqn;
  }
  if (w == 4 && world()->rank() > 0) {
    EXPECT_GT(empty_shards, 0);  // second.* (1 row) lives on rank 0 alone
  }
}

TEST(Fsdp, ErrorsNameTheProblem) {
  auto model = std::make_shared<Transformer>(tiny_args(), 3);
  auto mesh = mesh_1d();
  fully_shard(*model->blocks[0], mesh);
  try {
    fully_shard(*model->blocks[0], mesh);
    FAIL() << "sharding a module twice must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already sharded"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fully_shard(*model->blocks[1], nullptr), Error);
}

// Per-module meshes: block 0 sharded over the whole world, block 1 over pairs of ranks
// (replicated across pairs), the root over the world; gradients and the clip norm must equal the
// single process's.
TEST(Fsdp, ModulesOnDifferentMeshesAndTheirClipNorm) {
  if (world()->size() != 4) GTEST_SKIP() << "two different meshes need 4 ranks";
  auto ref = std::make_shared<Transformer>(tiny_args(), 3);
  auto model = std::make_shared<Transformer>(tiny_args(), 3);
  auto dp = mesh_1d();
  auto pairs = DeviceMesh::create(world(), {2, 2}, {"replicate", "shard"});
  FullyShardOptions opts;
  opts.gradient_divide_factor = 1;
  fully_shard(*model->blocks[0], dp, opts);
  fully_shard(*model->blocks[1], pairs, opts);
  fully_shard(*model, dp, opts);

  Tensor batch = global_batch(0, tiny_args().vocab_size);
  auto loss_of = [&](Transformer& m, const Tensor& b) {
    Tensor logits = m(b.narrow(1, 0, kSeq).contiguous());
    Tensor l = runtime::cross_entropy(logits, b.narrow(1, 1, kSeq).contiguous(), -100,
                                      runtime::Reduction::Sum);
    return runtime::mul(l, 1.0 / double(kBatch * kSeq));
  };
  loss_of(*ref, batch).backward();
  loss_of(*model, batch.narrow(0, world()->rank(), 1)).backward();

  auto params = distributed_parameters(*model);
  auto want = ref->named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_NE(params[i].dtensor, nullptr);
    DTensor grad = *params[i].dtensor;
    grad.local = params[i].param.grad();
    EXPECT_TRUE(testing::all_close(grad.full_tensor(), want[i].second.grad(), 1e-6, 1e-4))
        << params[i].fqn;
  }
  const double want_norm = runtime::optim::total_grad_norm(ref->parameters());
  EXPECT_NEAR(total_grad_norm(params), want_norm, 1e-5 * want_norm);
  const double want_inf = runtime::optim::total_grad_norm(ref->parameters(), INFINITY);
  EXPECT_NEAR(total_grad_norm(params, INFINITY), want_inf, 1e-5 * want_inf);
  // A plain tensor (same on every rank) counts once.
  Tensor extra = runtime::from_vector<float>({3, 4}, {2});
  extra.set_grad(runtime::from_vector<float>({3, 4}, {2}));
  params.push_back({"extra", extra, nullptr});
  EXPECT_NEAR(total_grad_norm(params), std::sqrt(want_norm * want_norm + 25), 1e-5 * want_norm);
  // The device-resident path (what a CUDA step uses) gives the same norm, bitwise, for both
  // orders, and the same clipped gradients as the host path.
  for (double p : {2.0, double(INFINITY)}) {
    const Tensor on_device = total_grad_norm_tensor(params, p);
    EXPECT_EQ(on_device.dim(), 0);
    EXPECT_EQ(on_device.item<double>(), total_grad_norm(params, p)) << "p = " << p;
  }
  std::vector<Tensor> before;
  for (const auto& dp : params) before.push_back(dp.param.grad().clone());
  const double host_norm = clip_grad_norm_(params, 0.05);
  std::vector<Tensor> host_clipped;
  for (size_t i = 0; i < params.size(); ++i) {
    host_clipped.push_back(params[i].param.grad().clone());
    params[i].param.grad().copy_(before[i]);
  }
  EXPECT_EQ(clip_grad_norm_on_device_(params, 0.05).item<double>(), host_norm);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(params[i].param.grad().to_vector<double>(), host_clipped[i].to_vector<double>())
        << params[i].fqn;
  // Non-finite totals throw on every rank when asked to.
  extra.grad().fill_(NAN);
  EXPECT_THROW(clip_grad_norm_(params, 1.0, 2.0, /*error_if_nonfinite=*/true), Error);
}

}  // namespace
}  // namespace mt::parallel
