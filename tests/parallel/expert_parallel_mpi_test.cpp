// Expert parallelism's token exchange on real ranks (mpirun -np 2 and -np 4): dispatch, a
// per-expert function on the owning rank, combine, and the gradients through both all-to-alls,
// against the same function applied locally.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "parallel/clip_grad.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/expert/token_exchange.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/autograd/engine.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"
#include "runtime/ops/reduce.h"
#include "runtime/nn/module.h"
#include "tests/testing/tensor_testing.h"

namespace mt::parallel {
namespace {

using runtime::Tensor;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(MpiProcessGroup::world());
  return pg;
}

// Expert e's stand-in: rows * (e + 1) + e, so a row processed by the wrong expert shows.
Tensor expert_fn(const Tensor& rows, int64_t e) {
  return runtime::add(runtime::mul(rows, double(e + 1)), double(e));
}

// Applies expert_fn block by block: rows grouped by expert `first + g` with counts[g].
Tensor apply_experts(const Tensor& x, const std::vector<int64_t>& counts, int64_t first) {
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) parts.push_back(expert_fn(x.narrow(0, start, counts[g]), first + int64_t(g)));
    start += counts[g];
  }
  // No rows: still an autograd result, so this rank takes part in the backward all-to-alls.
  if (parts.empty()) return runtime::mul(x, 1.0);
  return runtime::cat(parts, 0);
}

// Per-rank counts for `experts` experts: varied, some zero; rank `empty_rank` sends nothing.
std::vector<int64_t> counts_for(int rank, int64_t experts, int empty_rank) {
  std::vector<int64_t> c(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) c[size_t(e)] = rank == empty_rank ? 0 : (rank * 3 + e * 5) % 7;
  return c;
}

void check_round_trip(int64_t experts, int empty_rank) {
  const int rank = world()->rank();
  ExpertTokenExchange exchange(world(), experts);
  const std::vector<int64_t> counts = counts_for(rank, experts, empty_rank);
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  const int64_t dim = 3;
  const Tensor x = testing::randn64({n, dim}, 100 + uint64_t(rank));
  const Tensor w = testing::randn64({n, dim}, 200 + uint64_t(rank), false);

  auto [local_x, local_counts] = exchange.dispatch(x, counts);
  ASSERT_EQ(int64_t(local_counts.size()), exchange.num_local_experts());
  // Each local expert receives what every rank's counts said it would.
  for (int64_t l = 0; l < exchange.num_local_experts(); ++l) {
    int64_t expected = 0;
    for (int r = 0; r < world()->size(); ++r) {
      expected += counts_for(r, experts, empty_rank)[size_t(exchange.first_local_expert() + l)];
    }
    EXPECT_EQ(local_counts[size_t(l)], expected) << "local expert " << l;
  }
  const Tensor y = exchange.combine(
      apply_experts(local_x, local_counts, exchange.first_local_expert()));
  const Tensor x_ref = testing::leaf(x.detach());
  const Tensor y_ref = apply_experts(x_ref, counts, 0);
  ASSERT_EQ(y.shape(), y_ref.shape());
  EXPECT_TRUE(testing::all_close(y, y_ref, 1e-12, 1e-12));

  // Gradients through combine and dispatch: d/dx sum(y * w) = (e + 1) w, as locally. Every rank
  // runs the backward (its all-to-alls are collectives), also one without tokens.
  runtime::autograd::backward({runtime::sum(runtime::mul(y, w))});
  if (n == 0) return;
  runtime::autograd::backward({runtime::sum(runtime::mul(y_ref, w))});
  EXPECT_TRUE(testing::all_close(x.grad(), x_ref.grad(), 1e-12, 1e-12));
}

TEST(ExpertTokenExchange, RoundTripMatchesLocalExpertsTwoPerRank) {
  check_round_trip(2 * world()->size(), /*empty_rank=*/-1);
}

TEST(ExpertTokenExchange, RoundTripWithARankThatSendsNothing) {
  check_round_trip(world()->size(), /*empty_rank=*/world()->size() - 1);
}

TEST(ExpertTokenExchange, ExpertCountNotDivisibleByEpIsAClearError) {
  try {
    ExpertTokenExchange exchange(world(), 2 * world()->size() + 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be split evenly"), std::string::npos) << e.what();
  }
}

// Stand-in for the routed experts' weights: this rank's [E / ep, 3, 4] rows of a global [E, 3, 4].
class LocalExperts : public runtime::nn::Module {
 public:
  LocalExperts(const Tensor& global, int64_t ep_rank, int64_t local) : Module("LocalExperts") {
    w = global.narrow(0, ep_rank * local, local).contiguous();
    register_parameter("w", w);
  }
  Tensor operator()(const Tensor& x) {
    return call({x}, [this](const std::vector<Tensor>& in) { return runtime::mul(w, in[0]); });
  }
  Tensor w;
};

// Routed experts sharded over ep (outer Shard(0)) and then by FSDP over efsdp along dim 0 or 1
// (dim 1: more ranks than experts to shard): global coordinates in the DTensor, the full tensor
// back from the shards, gradients summed over efsdp, and the clip norm over both meshes.
void check_expert_fsdp(int64_t experts, int64_t shard_dim) {
  const int64_t world_size = world()->size();
  const int64_t ep = 2, efsdp = world_size / ep;
  auto mesh = DeviceMesh::create(world(), {ep, efsdp}, {"ep", "efsdp"});
  const int64_t local = experts / ep;
  const Tensor global = runtime::randn({experts, 3, 4}, runtime::RandomKey(3, "experts"),
                                       runtime::TensorOptions{}.with_dtype(runtime::DType::F64));
  const Tensor x_global = runtime::randn({experts, 3, 4}, runtime::RandomKey(4, "x"),
                                         runtime::TensorOptions{}.with_dtype(runtime::DType::F64));
  auto module = std::make_shared<LocalExperts>(global, mesh->coordinate("ep"), local);
  FullyShardOptions options;
  options.shard_dim = shard_dim;
  options.gradient_divide_factor = 1.0;
  options.outer = OuterSharding{mesh, {Shard{0}, Replicate{}}};
  fully_shard(*module, mesh->submesh({"efsdp"}), options);

  const auto params = distributed_parameters(*module);
  ASSERT_EQ(params.size(), 1u);
  const DTensor& d = *params[0].dtensor;
  EXPECT_EQ(d.global_shape, (runtime::Shape{experts, 3, 4}));
  EXPECT_EQ(d.local_offset[0] >= mesh->coordinate("ep") * local, true);
  // The shard holds the global tensor's values at its global offset.
  Tensor expected = global;
  for (int64_t dim = 0; dim < 3; ++dim) {
    expected = expected.narrow(dim, d.local_offset[size_t(dim)], d.local.size(dim));
  }
  EXPECT_TRUE(testing::all_close(d.local, expected, 0, 0));
  EXPECT_TRUE(testing::all_close(d.full_tensor(), global, 0, 0));

  // Every efsdp rank of an ep group computes sum(w * x) on the same local experts: the shard's
  // gradient is efsdp times its slice of x.
  const Tensor x_local = x_global.narrow(0, mesh->coordinate("ep") * local, local);
  runtime::sum((*module)(x_local)).backward();
  Tensor x_piece = x_global;
  for (int64_t dim = 0; dim < 3; ++dim) {
    x_piece = x_piece.narrow(dim, d.local_offset[size_t(dim)], d.local.size(dim));
  }
  ASSERT_TRUE(params[0].param.grad().defined());
  EXPECT_TRUE(testing::all_close(params[0].param.grad(), runtime::mul(x_piece, double(efsdp)),
                                 1e-12, 1e-12));
  // Each shard counted once across ep and efsdp: the norm of efsdp * x_global.
  const double norm = total_grad_norm(params);
  const double want = std::sqrt(runtime::sum(runtime::square(x_global)).item<double>()) * double(efsdp);
  EXPECT_NEAR(norm, want, 1e-9 * want);
}

TEST(ExpertFsdp, ExpertsShardedOnDim0OverEfsdp) {
  if (world()->size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  check_expert_fsdp(/*experts=*/2 * world()->size(), /*shard_dim=*/0);
}

TEST(ExpertFsdp, FewerExpertsThanRanksShardDim1) {
  if (world()->size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  check_expert_fsdp(/*experts=*/2, /*shard_dim=*/1);
}

}  // namespace
}  // namespace mt::parallel
