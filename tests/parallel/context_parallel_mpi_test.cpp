// Context parallelism's pieces (parallel/context) on real ranks (mpirun -np 2 and 4): the load-
// balanced split of a sequence, and causal attention over a sequence split across the cp ranks,
// by the all-gather and by the ring, against the same attention on the whole sequence in one
// process (f64: forward and the q, k and v gradients to 1e-12), on the world as one cp group and
// on 4 ranks as two cp groups of 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "parallel/comm/mpi_process_group.h"
#include "parallel/context/context_parallel.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/in_order_p2p.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::parallel {
namespace {

using mt::testing::all_close;
using mt::testing::error_of;
using runtime::Tensor;

constexpr double kTol = 1e-12;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> w(MpiProcessGroup::world());
  return w;
}

TEST(LoadBalancedPositions, EachRankHoldsAnEarlyAndALateChunk) {
  EXPECT_EQ(load_balanced_positions(8, 2, 0), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(load_balanced_positions(8, 2, 1), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(load_balanced_positions(4, 1, 0), (std::vector<int64_t>{0, 1, 2, 3}));
  // Every position once over the ranks, for several degrees.
  for (const int64_t cp : {1, 2, 3, 4}) {
    std::vector<int64_t> all;
    for (int64_t r = 0; r < cp; ++r) {
      const std::vector<int64_t> p = load_balanced_positions(24, cp, r);
      all.insert(all.end(), p.begin(), p.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> want(24);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(all, want) << "cp " << cp;
  }
  EXPECT_NE(error_of([] { load_balanced_positions(10, 4, 0); }).find("multiple of 8"),
            std::string::npos);
  EXPECT_NE(error_of([] { load_balanced_positions(8, 2, 2); }).find("rank 2"), std::string::npos);
}

// The whole-sequence tensors [B, S, H, D] (f64, the same on every rank), and this rank's shard.
struct Qkv {
  Tensor q, k, v;  // leaves
};

Qkv random_qkv(int64_t b, int64_t s, int64_t hq, int64_t hkv, int64_t d, uint64_t seed) {
  return {mt::testing::randn64({b, s, hq, d}, seed, true, "q"),
          mt::testing::randn64({b, s, hkv, d}, seed, true, "k"),
          mt::testing::randn64({b, s, hkv, d}, seed, true, "v")};
}

Tensor leaf_of(const Tensor& t) {
  Tensor l = t.detach().contiguous();
  l.set_requires_grad(true);
  return l;
}

// Causal attention over a sequence split across `mesh` (1-D) equals one process's, forward and
// backward: each rank's output and gradients are its shard of the whole ones.
void expect_attention_matches_one_process(const std::shared_ptr<DeviceMesh>& mesh,
                                          ContextParallelRotate rotate) {
  const ContextParallel cp(mesh, rotate);
  const int64_t b = 2, s = 8 * cp.degree(), hq = 4, hkv = 2, d = 8;
  const Qkv full = random_qkv(b, s, hq, hkv, d, 7);
  const Tensor w = mt::testing::randn64({b, s, hq, d}, 7, false, "w");  // loss weights
  // One process: the whole sequence.
  const Tensor out = runtime::scaled_dot_product_attention(
      full.q.transpose(1, 2), full.k.transpose(1, 2), full.v.transpose(1, 2), true);
  runtime::sum(runtime::mul(out.transpose(1, 2), w)).backward();
  // The cp ranks: each its shard.
  const Tensor q = leaf_of(cp.shard(full.q)), k = leaf_of(cp.shard(full.k)),
               v = leaf_of(cp.shard(full.v));
  const Tensor local =
      cp.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
  ASSERT_EQ(local.shape(), (runtime::Shape{b, hq, s / cp.degree(), d}));
  runtime::sum(runtime::mul(local.transpose(1, 2), cp.shard(w))).backward();
  EXPECT_TRUE(all_close(local.transpose(1, 2), cp.shard(out.transpose(1, 2)), kTol, kTol));
  EXPECT_TRUE(all_close(q.grad(), cp.shard(full.q.grad()), kTol, kTol));
  EXPECT_TRUE(all_close(k.grad(), cp.shard(full.k.grad()), kTol, kTol));
  EXPECT_TRUE(all_close(v.grad(), cp.shard(full.v.grad()), kTol, kTol));
}

// Both rotate methods: the all-gather and the ring.
class ContextParallelAttention : public ::testing::TestWithParam<ContextParallelRotate> {};

TEST_P(ContextParallelAttention, TheWorldAsOneGroupMatchesOneProcess) {
  expect_attention_matches_one_process(DeviceMesh::create(world(), {world()->size()}, {"cp"}),
                                       GetParam());
}

TEST_P(ContextParallelAttention, InnerGroupsOfAMeshMatchOneProcess) {
  ASSERT_EQ(world()->size() % 2, 0) << "runs on 2 and 4 ranks";
  // (dp, cp): each pair of neighbours splits its own sequences.
  const auto mesh = DeviceMesh::create(world(), {world()->size() / 2, 2}, {"dp", "cp"});
  expect_attention_matches_one_process(mesh->submesh({"cp"}), GetParam());
}

// On GPUs the ring's messages run in issue order on NCCL's stream, each send waiting for its
// receive: each pass is one batch_isend_irecv, so the ring cannot deadlock there. Over a group
// whose messages behave so (testing::InOrderPointToPointGroup) it matches one process too.
TEST(ContextParallelRing, RunsOverInOrderPointToPoint) {
  auto mpi = std::shared_ptr<MpiProcessGroup>(
      dynamic_cast<MpiProcessGroup*>(world()->split(0, world()->rank()).release()));
  auto in_order = std::make_shared<mt::testing::InOrderPointToPointGroup>(mpi);
  expect_attention_matches_one_process(
      DeviceMesh::create(in_order, {in_order->size()}, {"cp"}), ContextParallelRotate::Ring);
}

INSTANTIATE_TEST_SUITE_P(Rotate, ContextParallelAttention,
                         ::testing::Values(ContextParallelRotate::AllGather,
                                           ContextParallelRotate::Ring),
                         [](const auto& info) {
                           return info.param == ContextParallelRotate::Ring ? "Ring" : "AllGather";
                         });

TEST(ContextParallelErrors, RejectsWhatItCannotSplit) {
  const ContextParallel cp(DeviceMesh::create(world(), {world()->size()}, {"cp"}));
  const Tensor odd = mt::testing::randn64({1, 3, 2, 4}, 1, false);
  EXPECT_NE(error_of([&] { cp.attention(odd.transpose(1, 2), odd.transpose(1, 2),
                                        odd.transpose(1, 2)); })
                .find("the same even T"),
            std::string::npos);
  const Tensor tokens = mt::testing::randn64({2, 2 * world()->size() + 1}, 1, false);
  EXPECT_NE(error_of([&] { cp.shard(tokens); }).find("cannot be split"), std::string::npos);
}

}  // namespace
}  // namespace mt::parallel
