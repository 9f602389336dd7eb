// DTensor redistribution and ops (parallel/tensor/) on real ranks (mpirun -np 2, 3 and 4), checked
// against the same math on full tensors. Every rank draws the same full f64 tensors, takes its
// piece with distribute_tensor (Partial: the value on coordinate 0, zeros elsewhere), and
//  - redistributes between every pair of placements on 1-D meshes and a representative set on a
//    2x2 mesh (nested shards, StridedShard, Partial beside Shard), with uneven and empty chunks:
//    the result's full tensor is the input, its local piece has local_piece()'s shape, and the
//    gradient of sum(W * y) reaching the input's leaf piece is W's piece, whichever gradient form
//    (whole or Partial(sum)) the consumer gives;
//  - checks the plans' collectives (one all-to-all, one reduce-scatter) and the refused cases;
//  - runs each DTensor op's documented strategies (linear, add, mul, rms_norm, softmax, sum,
//    transpose, embedding, cross_entropy and loss parallel, attention) forward and backward against
//    the runtime op on full tensors, and checks which output placement the dispatcher chose;
//  - checks the errors: an unregistered op, an op with no strategy for its inputs, bad inputs.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/mpi_process_group.h"
#include "parallel/mesh/device_mesh.h"
#include "parallel/mesh/dtensor.h"
#include "parallel/tensor/dtensor_ops.h"
#include "parallel/tensor/op_strategy.h"
#include "parallel/tensor/redistribute.h"
#include "runtime/core/error.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/grouped_matmul.h"
#include "runtime/ops/rope.h"
#include "runtime/ops/join.h"
#include "runtime/ops/embedding.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/rms_norm.h"
#include "runtime/ops/softmax.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::parallel {
namespace {

using mt::testing::all_close;
using mt::testing::error_of;
using runtime::DType;
using runtime::Reduction;
using runtime::Tensor;
using Placements = std::vector<Placement>;
using MeshPtr = std::shared_ptr<DeviceMesh>;

constexpr double kTol = 1e-12;  // f64 results, absolute and relative
const Placement S0 = Shard{0}, S1 = Shard{1}, S2 = Shard{2}, R = Replicate{}, P = Partial{};

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> w(MpiProcessGroup::world());
  return w;
}

MeshPtr mesh_1d() { return DeviceMesh::create(world(), {world()->size()}, {"x"}); }
MeshPtr mesh_2x2() { return DeviceMesh::create(world(), {2, 2}, {"a", "b"}); }

// The 1-D meshes to run on: the world, and on 4 ranks also the size-2 dim "b" of a 2x2 mesh (a
// group that is not the world).
std::vector<MeshPtr> one_dim_meshes() {
  std::vector<MeshPtr> out{mesh_1d()};
  if (world()->size() == 4) out.push_back(mesh_2x2()->submesh({"b"}));
  return out;
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

// A full f64 tensor, the same on every rank (drawn from a fixed key named `name`).
Tensor full_randn(const Shape& shape, const std::string& name) {
  return mt::testing::randn64(shape, 2024, /*requires_grad=*/false, name);
}

// The box of `full` at `piece` (Partial and Replicate dims are not cut).
Tensor piece_of(const Tensor& full, const LocalPiece& piece) {
  Tensor t = full;
  for (size_t d = 0; d < piece.shape.size(); ++d)
    t = t.narrow(int64_t(d), piece.offset[d], piece.shape[d]);
  return t.contiguous();
}
Tensor piece_of(const Tensor& full, const DTensor& x) {
  return piece_of(full, local_piece(x.global_shape, *x.mesh, x.placements));
}

// This rank's piece of `full` as `placements`, as a leaf (requiring grad when asked) under a
// DTensor made by from_local.
struct Leaf {
  Tensor local;
  DTensor dt;
};
Leaf leaf_of(const Tensor& full, const MeshPtr& mesh, const Placements& placements,
             bool requires_grad = true,
             std::optional<Placements> local_grad_placements = std::nullopt) {
  Tensor local = distribute_tensor(full, mesh, placements).local.detach();
  if (requires_grad) local.set_requires_grad(true);
  return {local, from_local(local, mesh, placements, full.shape(), local_grad_placements)};
}

// This rank's term of sum(W * Y), Y the whole tensor `y` holds, its local piece taken with whole
// gradients (to_local's default): the gradient of each rank's term w.r.t. its piece is W's piece,
// which is the whole gradient of sum(W * Y), in the form to_local was told.
Tensor local_loss(const DTensor& y, const Tensor& w_full,
                  std::optional<Placements> local_grad_placements = std::nullopt) {
  return runtime::sum(runtime::mul(to_local(y, local_grad_placements), piece_of(w_full, y)));
}

// The leaf's gradient is `grad_full`'s piece for its placements (on every rank for Replicate and
// Partial dims). No collectives: a failure here cannot leave other ranks waiting.
void expect_leaf_grad(const Leaf& x, const Tensor& grad_full, double tol, const std::string& what) {
  const Tensor g = x.local.grad();
  if (!g.defined()) {
    ADD_FAILURE() << what << ": no gradient reached the leaf";
    return;
  }
  EXPECT_TRUE(all_close(g, piece_of(grad_full, x.dt), tol, tol)) << what;
}

// Whether `ok` holds on every rank (collective over the world). Checks that would run collectives
// on a wrongly shaped piece, or after some ranks threw, first agree on this, so that a failure
// is reported instead of leaving the ranks waiting on each other.
bool on_all_ranks(bool ok) {
  Tensor t = runtime::full({1}, ok ? 1.0 : 0.0, runtime::TensorOptions{}.with_dtype(DType::I64));
  world()->all_reduce(t, ReduceOp::Min, "test.agree");
  return t.item<int64_t>() == 1;
}

// Runs `fn`, returning the message of the mt::Error it throws ("" when none).
std::string error_or_empty(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Rank r's share of a whole on the mesh dims where `placements` is Replicate, as a Partial(sum)
// gradient would split it: (c + 1) / (n (n + 1) / 2) per such dim (c: this rank's coordinate).
double replicate_share(const DeviceMesh& mesh, const Placements& placements) {
  double share = 1;
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!is_replicate(placements[i])) continue;
    const double n = double(mesh.size(int64_t(i))), c = double(mesh.coordinate(int64_t(i)));
    share *= (c + 1) / (n * (n + 1) / 2);
  }
  return share;
}

// ---- redistribute ----------------------------------------------------------------------------

// redistribute(from -> to) of `full` on `mesh`: forward against the full tensor, and backward
// with the consumer's gradient given three ways: whole, converted by to_local (the default);
// whole, declared to redistribute (grad_placements); Partial(sum) on Replicate dims, given
// through to_local as the DTensor-op form. Each time the leaf's gradient must be W's piece.
void check_redistribute(const MeshPtr& mesh, const Tensor& full, const Placements& from,
                        const Placements& to) {
  SCOPED_TRACE(placements_name(from) + " -> " + placements_name(to) + " of " +
               detail::concat(full.shape()) + " on " + mesh->describe());
  const Tensor w = full_randn(full.shape(), "redistribute weight");
  const LocalPiece target = local_piece(full.shape(), *mesh, to);
  for (int form = 0; form < 3; ++form) {
    const Leaf x = leaf_of(full, mesh, from);
    DTensor y;
    const std::string error = error_or_empty([&] {
      y = form == 1 ? redistribute(x.dt, to, whole_grad_placements(to)) : redistribute(x.dt, to);
    });
    EXPECT_EQ(error, "");
    const bool shaped = error.empty() && y.local.shape() == target.shape;
    EXPECT_TRUE(shaped) << "local piece of shape "
                        << (error.empty() ? detail::concat(y.local.shape()) : "?") << ", expected "
                        << detail::concat(target.shape);
    if (!on_all_ranks(shaped)) return;
    if (form == 0) {
      EXPECT_EQ(y.placements, to);
      EXPECT_EQ(y.global_shape, full.shape());
      EXPECT_EQ(y.local_offset, target.offset);
      bool partial = false;
      for (const Placement& p : to) partial = partial || is_partial(p);
      if (!partial) {
        EXPECT_TRUE(all_close(y.local, piece_of(full, target), 0, 0)) << "local piece";
      }
      EXPECT_TRUE(all_close(y.full_tensor(), full, 0, 0)) << "full tensor";
    }
    Tensor loss = form == 2 ? runtime::mul(local_loss(y, w, op_grad_placements(to)),
                                           replicate_share(*mesh, to))
                            : local_loss(y, w);
    const std::string back_error = error_or_empty([&] { loss.backward(); });
    EXPECT_EQ(back_error, "") << "backward, gradient form " << form;
    if (!on_all_ranks(back_error.empty())) return;
    expect_leaf_grad(x, w, kTol, "gradient form " + std::to_string(form));
  }
}

// [5, 7]: uneven on 2 and 4 ranks; [3, 6]: the last 4-rank chunk of either dim is empty.
const std::vector<Shape> kRedistributeShapes = {{5, 7}, {3, 6}};

TEST(Redistribute, EveryPairOfPlacementsOnOneDimMeshes) {
  const std::vector<Placement> all = {S0, S1, R, P};
  for (const MeshPtr& mesh : one_dim_meshes()) {
    for (const Shape& shape : kRedistributeShapes) {
      const Tensor full = full_randn(shape, "redistribute input");
      for (const Placement& from : all)
        for (const Placement& to : all) check_redistribute(mesh, full, {from}, {to});
    }
  }
}

TEST(Redistribute, TwoDimPlacementsOnATwoByTwoMesh) {
  if (world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const MeshPtr mesh = mesh_2x2();
  const Placement strided = StridedShard{0, 2};  // on mesh dim a, cut after b's Shard(0)
  const std::vector<Placements> set = {{S0, S0}, {S0, S1}, {S1, S0}, {R, S1}, {P, S0},
                                       {strided, S0}, {R, R}, {P, P}, {S1, R}, {P, R},
                                       {S1, P}};
  for (const Shape& shape : kRedistributeShapes) {
    const Tensor full = full_randn(shape, "redistribute input");
    for (const Placements& from : set)
      for (const Placements& to : set) check_redistribute(mesh, full, from, to);
  }
}

// StridedShard(0, sf=2) on a with Shard(0) on b: rows are cut by b first ([0, 3) and [3, 5) of
// 5), then each half by a; rank r sits at (a, b) = (r / 2, r % 2).
TEST(Redistribute, StridedShardPiecesAreCutByTheLaterMeshDimFirst) {
  if (world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int r = world()->rank();
  const MeshPtr mesh = mesh_2x2();
  const Tensor full = full_randn({5, 7}, "strided");
  const int64_t offsets[] = {0, 3, 2, 4}, lengths[] = {2, 1, 1, 1};
  const DTensor x = distribute_tensor(full, mesh, {StridedShard{0, 2}, S0});
  EXPECT_EQ(x.local_offset, (Shape{offsets[r], 0}));
  EXPECT_TRUE(all_close(x.local, full.narrow(0, offsets[r], lengths[r]), 0, 0));
  // From plain nested shards (a first) and back.
  const DTensor y = redistribute(distribute_tensor(full, mesh, {S0, S0}), {StridedShard{0, 2}, S0});
  EXPECT_TRUE(all_close(y.local, full.narrow(0, offsets[r], lengths[r]), 0, 0));
  EXPECT_TRUE(all_close(redistribute(y, {S0, S0}).full_tensor(), full, 0, 0));
}

// A Replicate leaf whose code takes Partial(sum) gradients (from_local's local_grad_placements):
// the ranks' gradients sum to the whole gradient.
TEST(Redistribute, PartialGradientsOfAReplicateLeafSumToTheWholeGradient) {
  for (const MeshPtr& mesh : one_dim_meshes()) {
    const Tensor full = full_randn({5, 7}, "input"), w = full_randn({5, 7}, "weight");
    for (const Placement& to : {S0, S1, R}) {
      SCOPED_TRACE(placement_name(to) + " on " + mesh->describe());
      const Leaf x = leaf_of(full, mesh, {R}, true, Placements{P});
      local_loss(redistribute(x.dt, {to}), w).backward();
      Tensor summed = x.local.grad().contiguous().clone();
      mesh->group(0).all_reduce(summed, ReduceOp::Sum, "test.grad_sum");
      EXPECT_TRUE(all_close(summed, w, kTol, kTol));
    }
  }
}

// Partial(avg) is the mean of the ranks' values, so d(mean)/d(piece) = W / n. The header refuses
// gradients through Partial(avg): either refused, or (if not) the gradient must be W / n.
TEST(Redistribute, GradientsThroughPartialAverageAreRefused) {
  const MeshPtr mesh = mesh_1d();
  const Tensor full = full_randn({5, 7}, "input"), w = full_randn({5, 7}, "weight");
  const Leaf x = leaf_of(full, mesh, {Partial{ReduceOp::Avg}});
  std::optional<DTensor> y;
  const std::string e = error_of([&] { y = redistribute(x.dt, {R}); });
  if (!e.empty()) {
    expect_contains(e, "no gradient through Partial(avg)");
    return;
  }
  local_loss(*y, w).backward();
  expect_leaf_grad(x, runtime::div(w, double(mesh->size())), kTol, "Partial(avg) leaf");
}

// ---- plans -----------------------------------------------------------------------------------

TEST(RedistributePlan, UsesOneCollectivePerChangeAndRefusesUnsoundOnes) {
  const MeshPtr mesh = mesh_1d();
  const int64_t n = mesh->size(), f64 = 8;
  const Shape shape{5, 7};
  const auto plan = [&](const Placements& from, const Placements& to) {
    return plan_redistribute(shape, f64, *mesh, from, to);
  };
  const int64_t rows = chunk_range(5, n, 0).padded_length;  // padded rows per rank
  EXPECT_EQ(plan({S0}, {S1}).describe(), "all_to_all(mesh dim 0)");
  EXPECT_EQ(plan({S0}, {S1}).bytes(), rows * 7 * f64);
  EXPECT_EQ(plan({P}, {S0}).describe(), "reduce_scatter(mesh dim 0)");
  EXPECT_EQ(plan({P}, {S0}).bytes(), 35 * f64);
  EXPECT_EQ(plan({S1}, {R}).describe(), "all_gather(mesh dim 0)");
  EXPECT_EQ(plan({S1}, {R}).bytes(), 35 * f64);
  EXPECT_EQ(plan({P}, {R}).describe(), "all_reduce(mesh dim 0)");
  EXPECT_EQ(plan({R}, {S0}).describe(), "chunk(mesh dim 0)");
  EXPECT_EQ(plan({R}, {S0}).bytes(), 0);
  EXPECT_EQ(plan({S0}, {P}).describe(), "pad_to_partial(mesh dim 0)");
  EXPECT_EQ(plan({R}, {P}).describe(), "to_partial(mesh dim 0)");
  EXPECT_EQ(plan({S1}, {S1}).describe(), "nothing");

  std::string e = error_of([&] { plan({P}, {Partial{ReduceOp::Avg}}); });
  expect_contains(e, "not sound");
  expect_contains(e, "[Partial(sum)] -> [Partial(avg)]");
  e = error_of([&] { plan({S0}, {Partial{ReduceOp::Max}}); });
  expect_contains(e, "only a Replicate mesh dim can become Partial(max)");
}

TEST(RedistributePlan, TwoDimPlansAllReduceWhereTheTensorIsSmallest) {
  if (world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const MeshPtr mesh = mesh_2x2();
  // (P, S0) -> (R, R): all-reduce the [3, 7] piece (padded), then all-gather [5, 7].
  const RedistributePlan up = plan_redistribute({5, 7}, 8, *mesh, {P, S0}, {R, R});
  EXPECT_EQ(up.describe(), "all_reduce(mesh dim 0) -> all_gather(mesh dim 1)");
  EXPECT_EQ(up.bytes(), (21 + 35) * 8);
  // (P, R) -> (S0, S1): reduce-scatter then a local chunk, no all-reduce.
  const RedistributePlan down = plan_redistribute({5, 7}, 8, *mesh, {P, R}, {S0, S1});
  EXPECT_EQ(down.describe(), "reduce_scatter(mesh dim 0) -> chunk(mesh dim 1)");
  // Nested shards that share their first cut keep it.
  EXPECT_EQ(plan_redistribute({5, 7}, 8, *mesh, {S0, S0}, {S0, R}).describe(),
            "all_gather(mesh dim 1)");
}

// ---- ops -------------------------------------------------------------------------------------

// One input of an op: its full value (the same on every rank), its placements, and whether it is
// differentiated (floating inputs).
struct In {
  Tensor full;
  Placements placements;
  bool grad = true;
};

using DOp = std::function<DTensor(const std::vector<DTensor>&)>;
using FullOp = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs `op` on DTensors of `ins` and `reference` on the full tensors: the output's full tensor,
// global shape and local piece shape, then the gradient of sum(W * output) for a fixed W reaching
// each input's leaf piece. Returns the output's placements (the dispatcher's choice). With
// `may_refuse`, an mt::Error on every rank is an acceptable answer (and {} is returned).
Placements check_op(const MeshPtr& mesh, const std::vector<In>& ins, const DOp& op,
                    const FullOp& reference, bool may_refuse = false, double tol = kTol) {
  std::string trace = "on " + mesh->describe() + ", inputs";
  for (const In& in : ins) trace += " " + placements_name(in.placements);
  SCOPED_TRACE(trace);
  std::vector<Tensor> full_leaves;
  for (const In& in : ins) {
    Tensor t = in.full.detach().clone();
    if (in.grad) t.set_requires_grad(true);
    full_leaves.push_back(t);
  }
  const Tensor want = reference(full_leaves);
  const Tensor w = full_randn(want.shape(), "op output weight");
  runtime::sum(runtime::mul(want, w)).backward();

  std::vector<Leaf> leaves;
  std::vector<DTensor> dts;
  for (const In& in : ins) {
    leaves.push_back(leaf_of(in.full, mesh, in.placements, in.grad));
    dts.push_back(leaves.back().dt);
  }
  DTensor y;
  const std::string error = error_or_empty([&] { y = op(dts); });
  if (may_refuse && !on_all_ranks(error.empty())) {
    EXPECT_TRUE(on_all_ranks(!error.empty())) << "refused on some ranks only: " << error;
    return {};
  }
  EXPECT_EQ(error, "");
  const bool shaped = error.empty() && y.global_shape == want.shape() &&
                      y.local.shape() == local_piece(y.global_shape, *mesh, y.placements).shape;
  if (error.empty()) {
    EXPECT_TRUE(shaped) << "global shape " << detail::concat(y.global_shape) << ", local "
                        << detail::concat(y.local.shape());
  }
  if (!on_all_ranks(shaped)) return y.placements;
  EXPECT_TRUE(all_close(y.full_tensor(), want.detach(), tol, tol)) << "forward";
  const std::string back_error = error_or_empty([&] { local_loss(y, w).backward(); });
  EXPECT_EQ(back_error, "") << "backward";
  if (!on_all_ranks(back_error.empty())) return y.placements;
  for (size_t k = 0; k < ins.size(); ++k)
    if (ins[k].grad)
      expect_leaf_grad(leaves[k], full_leaves[k].grad(), tol, "input " + std::to_string(k));
  return y.placements;
}

// The meshes for op tests: a 1-D mesh over all ranks, and on 4 ranks also the 2x2 mesh.
bool two_dim() { return world()->size() == 4; }

TEST(DTensorOps, Linear) {
  const Tensor x = full_randn({3, 5, 6}, "x"), w = full_randn({7, 6}, "w");
  const DOp op = [](const std::vector<DTensor>& d) { return dtensor::linear(d[0], d[1]); };
  const FullOp ref = [](const std::vector<Tensor>& t) { return runtime::linear(t[0], t[1]); };
  const MeshPtr m = mesh_1d();
  EXPECT_EQ(check_op(m, {{x, {R}}, {w, {S0}}}, op, ref), Placements{S2});  // column-wise
  EXPECT_EQ(check_op(m, {{x, {S2}}, {w, {S1}}}, op, ref), Placements{P});   // row-wise
  EXPECT_EQ(check_op(m, {{x, {S0}}, {w, {R}}}, op, ref), Placements{S0});   // batch
  EXPECT_EQ(check_op(m, {{x, {S1}}, {w, {R}}}, op, ref), Placements{S1});
  EXPECT_EQ(check_op(m, {{x, {P}}, {w, {R}}}, op, ref), Placements{P});
  EXPECT_EQ(check_op(m, {{x, {R}}, {w, {R}}}, op, ref), Placements{R});
  if (!two_dim()) return;
  const MeshPtr m2 = mesh_2x2();
  EXPECT_EQ(check_op(m2, {{x, {S0, R}}, {w, {R, S0}}}, op, ref), (Placements{S0, S2}));
  EXPECT_EQ(check_op(m2, {{x, {S0, S2}}, {w, {R, S1}}}, op, ref), (Placements{S0, P}));
  EXPECT_EQ(check_op(m2, {{x, {R, R}}, {w, {S0, S0}}}, op, ref), (Placements{S2, S2}));
}

TEST(DTensorOps, AddAndMulWithBroadcasting) {
  const Tensor a = full_randn({4, 5, 6}, "a"), b = full_randn({6}, "b");
  const Tensor c = full_randn({5, 7}, "c"), d = full_randn({5, 7}, "d");
  const DOp add = [](const std::vector<DTensor>& t) { return dtensor::add(t[0], t[1]); };
  const DOp mul = [](const std::vector<DTensor>& t) { return dtensor::mul(t[0], t[1]); };
  const FullOp add_ref = [](const std::vector<Tensor>& t) { return runtime::add(t[0], t[1]); };
  const FullOp mul_ref = [](const std::vector<Tensor>& t) { return runtime::mul(t[0], t[1]); };
  const MeshPtr m = mesh_1d();
  for (int k = 0; k < 2; ++k) {
    const DOp& op = k == 0 ? add : mul;
    const FullOp& ref = k == 0 ? add_ref : mul_ref;
    SCOPED_TRACE(k == 0 ? "add" : "mul");
    EXPECT_EQ(check_op(m, {{a, {S2}}, {b, {S0}}}, op, ref), Placements{S2});
    EXPECT_EQ(check_op(m, {{a, {S0}}, {b, {R}}}, op, ref), Placements{S0});
    EXPECT_EQ(check_op(m, {{a, {S1}}, {b, {R}}}, op, ref), Placements{S1});
    EXPECT_EQ(check_op(m, {{a, {R}}, {b, {R}}}, op, ref), Placements{R});
    EXPECT_EQ(check_op(m, {{c, {S1}}, {d, {S1}}}, op, ref), Placements{S1});
    EXPECT_EQ(check_op(m, {{c, {S0}}, {d, {S1}}}, op, ref).size(), 1u);  // redistributed
    if (two_dim()) {
      EXPECT_EQ(check_op(mesh_2x2(), {{a, {S0, S2}}, {b, {R, S0}}}, op, ref), (Placements{S0, S2}));
    }
  }
  EXPECT_EQ(check_op(m, {{a, {P}}, {b, {P}}}, add, add_ref), Placements{P});
  EXPECT_EQ(check_op(m, {{a, {P}}, {b, {R}}}, mul, mul_ref), Placements{P});
  EXPECT_EQ(check_op(m, {{a, {R}}, {b, {P}}}, mul, mul_ref), Placements{P});
}

TEST(DTensorOps, RmsNorm) {
  const Tensor x = full_randn({3, 5, 6}, "x"), w = full_randn({6}, "w");
  const DOp op = [](const std::vector<DTensor>& t) { return dtensor::rms_norm(t[0], t[1], 1e-6); };
  const FullOp ref = [](const std::vector<Tensor>& t) { return runtime::rms_norm(t[0], t[1], 1e-6); };
  const MeshPtr m = mesh_1d();
  EXPECT_EQ(check_op(m, {{x, {S1}}, {w, {R}}}, op, ref), Placements{S1});
  EXPECT_EQ(check_op(m, {{x, {S0}}, {w, {R}}}, op, ref), Placements{S0});
  // Sharded on the normalized dim: redistributed first, never normalized per piece.
  EXPECT_NE(check_op(m, {{x, {S2}}, {w, {R}}}, op, ref), Placements{S2});
  if (two_dim()) {
    EXPECT_EQ(check_op(mesh_2x2(), {{x, {S0, S1}}, {w, {R, R}}}, op, ref), (Placements{S0, S1}));
  }
}

TEST(DTensorOps, Softmax) {
  const Tensor x = full_randn({5, 7}, "x");
  const MeshPtr m = mesh_1d();
  for (int64_t dim : {1, -1, 0}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const DOp op = [dim](const std::vector<DTensor>& t) { return dtensor::softmax(t[0], dim); };
    const FullOp ref = [dim](const std::vector<Tensor>& t) { return runtime::softmax(t[0], dim); };
    const int64_t other = dim == 0 ? 1 : 0, own = dim < 0 ? dim + 2 : dim;
    EXPECT_EQ(check_op(m, {{x, {Shard{other}}}}, op, ref), Placements{Shard{other}});
    EXPECT_NE(check_op(m, {{x, {Shard{own}}}}, op, ref), Placements{Shard{own}});
    if (two_dim()) check_op(mesh_2x2(), {{x, {S0, S1}}}, op, ref);
  }
}

TEST(DTensorOps, SumOverADim) {
  const Tensor x = full_randn({5, 7}, "x"), y = full_randn({3, 5, 6}, "y");
  const auto sum_op = [](int64_t dim) {
    return DOp([dim](const std::vector<DTensor>& t) { return dtensor::sum(t[0], dim); });
  };
  const auto sum_ref = [](int64_t dim) {
    return FullOp([dim](const std::vector<Tensor>& t) { return runtime::sum(t[0], {dim}); });
  };
  const MeshPtr m = mesh_1d();
  EXPECT_EQ(check_op(m, {{x, {S1}}}, sum_op(1), sum_ref(1)), Placements{P});
  EXPECT_EQ(check_op(m, {{x, {S0}}}, sum_op(1), sum_ref(1)), Placements{S0});
  EXPECT_EQ(check_op(m, {{x, {P}}}, sum_op(0), sum_ref(0)), Placements{P});
  EXPECT_EQ(check_op(m, {{x, {R}}}, sum_op(0), sum_ref(0)), Placements{R});
  EXPECT_EQ(check_op(m, {{y, {S2}}}, sum_op(1), sum_ref(1)), Placements{S1});
  EXPECT_EQ(check_op(m, {{y, {S0}}}, sum_op(-1), sum_ref(2)), Placements{S0});
  if (two_dim()) {
    EXPECT_EQ(check_op(mesh_2x2(), {{x, {S0, S1}}}, sum_op(1), sum_ref(1)), (Placements{S0, P}));
    EXPECT_EQ(check_op(mesh_2x2(), {{y, {S1, S1}}}, sum_op(1), sum_ref(1)), (Placements{P, P}));
  }
}

TEST(DTensorOps, Transpose) {
  const Tensor x = full_randn({3, 5, 6}, "x");
  const auto op = [](int64_t a, int64_t b) {
    return DOp([a, b](const std::vector<DTensor>& t) { return dtensor::transpose(t[0], a, b); });
  };
  const auto ref = [](int64_t a, int64_t b) {
    return FullOp([a, b](const std::vector<Tensor>& t) { return t[0].transpose(a, b).contiguous(); });
  };
  const MeshPtr m = mesh_1d();
  EXPECT_EQ(check_op(m, {{x, {S1}}}, op(1, 2), ref(1, 2)), Placements{S2});
  EXPECT_EQ(check_op(m, {{x, {S0}}}, op(0, -1), ref(0, 2)), Placements{S2});
  EXPECT_EQ(check_op(m, {{x, {S0}}}, op(1, 2), ref(1, 2)), Placements{S0});
  EXPECT_EQ(check_op(m, {{x, {P}}}, op(0, 1), ref(0, 1)), Placements{P});
  EXPECT_EQ(check_op(m, {{x, {R}}}, op(0, 1), ref(0, 1)), Placements{R});
  if (two_dim()) {
    EXPECT_EQ(check_op(mesh_2x2(), {{x, {S0, S2}}}, op(0, 2), ref(0, 2)), (Placements{S2, S0}));
  }
}

TEST(DTensorOps, Embedding) {
  const Tensor weight = full_randn({11, 6}, "embedding");
  const Tensor ids = runtime::from_vector<int64_t>({0, 10, 3, 7, 5, 5, 1, 9, 2, 8, 4, 6}, {3, 4},
                                                   runtime::TensorOptions{}.with_dtype(DType::I64));
  const DOp op = [](const std::vector<DTensor>& t) { return dtensor::embedding(t[0], t[1]); };
  const FullOp ref = [](const std::vector<Tensor>& t) { return runtime::embedding(t[0], t[1]); };
  const MeshPtr m = mesh_1d();
  const auto check = [&](const MeshPtr& mesh, const Placements& w, const Placements& i) {
    return check_op(mesh, {{weight, w}, {ids, i, /*grad=*/false}}, op, ref);
  };
  EXPECT_EQ(check(m, {S0}, {R}), Placements{P});   // row-wise
  EXPECT_EQ(check(m, {S1}, {R}), Placements{S2});  // column-wise
  EXPECT_EQ(check(m, {R}, {S0}), Placements{S0});
  EXPECT_EQ(check(m, {R}, {S1}), Placements{S1});
  EXPECT_EQ(check(m, {R}, {R}), Placements{R});
  if (two_dim()) {
    EXPECT_EQ(check(mesh_2x2(), {S0, S1}, {R, R}), (Placements{P, S2}));
    EXPECT_EQ(check(mesh_2x2(), {R, S0}, {S0, R}), (Placements{S0, P}));
  }
}

// Cross-entropy over [6, 11] logits; target -100 at row 2 is ignored.
TEST(DTensorOps, CrossEntropyWithVocabShardedLogits) {
  const Tensor logits = full_randn({6, 11}, "logits");
  const Tensor targets = runtime::from_vector<int64_t>(
      {3, 10, -100, 0, 7, 5}, {6}, runtime::TensorOptions{}.with_dtype(DType::I64));
  const auto check = [&](const MeshPtr& mesh, const Placements& l, const Placements& t,
                         Reduction reduction) {
    const DOp op = [reduction](const std::vector<DTensor>& d) {
      return dtensor::cross_entropy(d[0], d[1], -100, reduction);
    };
    const FullOp ref = [reduction](const std::vector<Tensor>& d) {
      return runtime::cross_entropy(d[0], d[1], -100, reduction);
    };
    SCOPED_TRACE(reduction == Reduction::Sum ? "sum" : "none");
    return check_op(mesh, {{logits, l}, {targets, t, /*grad=*/false}}, op, ref);
  };
  const MeshPtr m = mesh_1d();
  EXPECT_EQ(check(m, {S1}, {R}, Reduction::Sum), Placements{R});  // loss parallel
  EXPECT_EQ(check(m, {S1}, {R}, Reduction::None), Placements{R});
  EXPECT_EQ(check(m, {S0}, {S0}, Reduction::Sum), Placements{P});
  EXPECT_EQ(check(m, {S0}, {S0}, Reduction::None), Placements{S0});
  EXPECT_EQ(check(m, {R}, {R}, Reduction::Sum), Placements{R});
  if (two_dim()) {
    const MeshPtr m2 = mesh_2x2();
    EXPECT_EQ(check(m2, {S0, S1}, {S0, R}, Reduction::Sum), (Placements{P, R}));
    EXPECT_EQ(check(m2, {S0, S1}, {S0, R}, Reduction::None), (Placements{S0, R}));
    EXPECT_EQ(check(m2, {S1, S1}, {R, R}, Reduction::Sum), (Placements{R, R}));
  }
  // Mean needs the global count of valid targets: refused.
  const DTensor l = distribute_tensor(logits, m, {S1}), t = distribute_tensor(targets, m, {R});
  expect_contains(error_of([&] { dtensor::cross_entropy(l, t, -100, Reduction::Mean); }),
                  "reduction Mean is not supported");
}

// The trainer's entry point: this rank's column block of [2, 3, 11] logits and every rank's
// targets give the whole loss on every rank, and each rank's backward() the gradient of its block.
TEST(DTensorOps, VocabParallelCrossEntropy) {
  const Tensor logits = full_randn({2, 3, 11}, "logits");
  const Tensor targets = runtime::from_vector<int64_t>(
      {3, 10, -100, 0, 7, 5}, {2, 3}, runtime::TensorOptions{}.with_dtype(DType::I64));
  for (const MeshPtr& mesh : one_dim_meshes()) {
    for (Reduction reduction : {Reduction::Sum, Reduction::None}) {
      SCOPED_TRACE(mesh->describe() + (reduction == Reduction::Sum ? " sum" : " none"));
      const Tensor full = logits.detach().clone().set_requires_grad(true);
      const Tensor want = runtime::cross_entropy(full, targets, -100, reduction);
      const Tensor w = full_randn(want.shape(), "loss weight");
      runtime::sum(runtime::mul(want, w)).backward();

      const ChunkRange cols = chunk_range(11, mesh->size(), mesh->coordinate(0));
      const Tensor local = logits.narrow(2, cols.offset, cols.length).contiguous().set_requires_grad(true);
      const Tensor got =
          dtensor::vocab_parallel_cross_entropy(local, targets, mesh, 11, -100, reduction);
      EXPECT_TRUE(all_close(got, want.detach(), kTol, kTol));
      runtime::sum(runtime::mul(got, w)).backward();
      ASSERT_TRUE(local.grad().defined());
      EXPECT_TRUE(all_close(local.grad(), full.grad().narrow(2, cols.offset, cols.length), kTol, kTol));
    }
  }
}

// q [B, H, T, D] and k, v [B, Hkv, T, D] with heads or batch sharded; sizes chosen so that no
// rank's piece is empty (7 = 4 + 3 = 2 + 2 + 2 + 1).
TEST(DTensorOps, ScaledDotProductAttention) {
  const int64_t W = world()->size();
  const int64_t heads = W == 4 ? 7 : 3, batch = W == 4 ? 7 : 3;
  const Tensor q = full_randn({batch, heads, 5, 4}, "q"), k = full_randn({batch, heads, 5, 4}, "k"),
               v = full_randn({batch, heads, 5, 4}, "v");
  const MeshPtr m = mesh_1d();
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    const DOp op = [causal](const std::vector<DTensor>& t) {
      return dtensor::scaled_dot_product_attention(t[0], t[1], t[2], causal);
    };
    const FullOp ref = [causal](const std::vector<Tensor>& t) {
      return runtime::scaled_dot_product_attention(t[0], t[1], t[2], causal);
    };
    EXPECT_EQ(check_op(m, {{q, {S1}}, {k, {S1}}, {v, {S1}}}, op, ref), Placements{S1});
    EXPECT_EQ(check_op(m, {{q, {S0}}, {k, {S0}}, {v, {S0}}}, op, ref), Placements{S0});
    EXPECT_EQ(check_op(m, {{q, {R}}, {k, {R}}, {v, {R}}}, op, ref), Placements{R});
    if (two_dim()) {
      EXPECT_EQ(check_op(mesh_2x2(), {{q, {S0, S1}}, {k, {S0, S1}}, {v, {S0, S1}}}, op, ref),
                (Placements{S0, S1}));
    }
    // Grouped-query attention with whole kv groups per rank: 2 query heads per kv head.
    const Tensor gq = full_randn({2, 2 * W, 5, 4}, "gq"), gk = full_randn({2, W, 5, 4}, "gk"),
                 gv = full_randn({2, W, 5, 4}, "gv");
    EXPECT_EQ(check_op(m, {{gq, {S1}}, {gk, {S1}}, {gv, {S1}}}, op, ref), Placements{S1});
    // Query-head chunks that do not hold whole kv groups: 2 query heads per kv head, and 6 q / 3
    // kv heads split 3 + 3 / 2 + 1 over 2 ranks (26 / 13 split 7 + 7 + 7 + 5 / 4 + 4 + 4 + 1
    // over 4). Query head h reads kv head h / 2; a rank's piece cannot compute that locally, so
    // the right answer is either the full result or a refusal on every rank.
    const int64_t kv = W == 4 ? 13 : 3;
    const Tensor mq = full_randn({1, 2 * kv, 5, 4}, "mq"), mk = full_randn({1, kv, 5, 4}, "mk"),
                 mv = full_randn({1, kv, 5, 4}, "mv");
    check_op(m, {{mq, {S1}}, {mk, {S1}}, {mv, {S1}}}, op, ref, /*may_refuse=*/true);
  }
}

// 3 heads over 4 ranks: the last rank holds no head (its piece is empty, not an error).
TEST(DTensorOps, ScaledDotProductAttentionWithAnEmptyHeadPiece) {
  const Tensor q = full_randn({2, 3, 5, 4}, "q"), k = full_randn({2, 3, 5, 4}, "k"),
               v = full_randn({2, 3, 5, 4}, "v");
  const DOp op = [](const std::vector<DTensor>& t) {
    return dtensor::scaled_dot_product_attention(t[0], t[1], t[2], true);
  };
  const FullOp ref = [](const std::vector<Tensor>& t) {
    return runtime::scaled_dot_product_attention(t[0], t[1], t[2], true);
  };
  EXPECT_EQ(check_op(mesh_1d(), {{q, {S1}}, {k, {S1}}, {v, {S1}}}, op, ref), Placements{S1});
}

// Reshapes keep a shard of a group's first dim when it splits evenly ([3, 2W, 4] <-> [3, 8W]);
// an uneven one is moved first (all-to-all or gather; never cut wrongly). cat keeps shards
// off its dim.
TEST(DTensorOps, ReshapeAndCat) {
  const int64_t W = world()->size();
  const MeshPtr m = mesh_1d();
  const Tensor x = full_randn({3, 2 * W, 4}, "x");
  const DOp flat = [W](const std::vector<DTensor>& t) {
    return dtensor::reshape(t[0], {3, -1});
  };
  const FullOp flat_ref = [](const std::vector<Tensor>& t) { return t[0].reshape({3, -1}); };
  EXPECT_EQ(check_op(m, {{x, {S1}}}, flat, flat_ref), Placements{S1});
  // 3 rows split evenly over 3 ranks only; over 2 or 4 the cheapest is one all-to-all onto
  // dim 1, which does.
  EXPECT_EQ(check_op(m, {{x, {S0}}}, flat, flat_ref), 3 % W == 0 ? Placements{S0} : Placements{S1});
  EXPECT_EQ(check_op(m, {{x, {R}}}, flat, flat_ref), Placements{R});
  const Tensor y = full_randn({3, 8 * W}, "y");
  const DOp unflat = [W](const std::vector<DTensor>& t) {
    return dtensor::reshape(t[0], {3, 2 * W, 4});
  };
  const FullOp unflat_ref = [W](const std::vector<Tensor>& t) {
    return t[0].reshape({3, 2 * W, 4});
  };
  EXPECT_EQ(check_op(m, {{y, {S1}}}, unflat, unflat_ref), Placements{S1});
  // 5 rows over 2, 3 or 4 ranks do not split evenly: never cut wrongly, but moved first (onto
  // the 3 rows with one all-to-all on 3 ranks; gathered on 2 and 4, where neither dim splits).
  const Tensor u = full_randn({3, 5, 4}, "u");
  const DOp uflat = [](const std::vector<DTensor>& t) { return dtensor::reshape(t[0], {3, 20}); };
  const FullOp uflat_ref = [](const std::vector<Tensor>& t) { return t[0].reshape({3, 20}); };
  EXPECT_EQ(check_op(m, {{u, {S1}}}, uflat, uflat_ref), 3 % W == 0 ? Placements{S0} : Placements{R});

  const Tensor a = full_randn({5, 3}, "a"), b = full_randn({5, 2}, "b");
  const DOp cat1 = [](const std::vector<DTensor>& t) { return dtensor::cat(t, 1); };
  const FullOp cat1_ref = [](const std::vector<Tensor>& t) { return runtime::cat(t, 1); };
  EXPECT_EQ(check_op(m, {{a, {S0}}, {b, {S0}}}, cat1, cat1_ref), Placements{S0});
  EXPECT_EQ(check_op(m, {{a, {R}}, {b, {R}}}, cat1, cat1_ref), Placements{R});
  // split: the second piece of [5, 3 | 4] along dim 1 (a narrow), rows sharded.
  const Tensor c = full_randn({5, 7}, "c");
  const DOp second = [](const std::vector<DTensor>& t) { return dtensor::split(t[0], {3, 4}, 1)[1]; };
  const FullOp second_ref = [](const std::vector<Tensor>& t) {
    return t[0].narrow(1, 3, 4).contiguous();
  };
  EXPECT_EQ(check_op(m, {{c, {S0}}}, second, second_ref), Placements{S0});
  EXPECT_EQ(check_op(m, {{c, {P}}}, second, second_ref), Placements{P});
  if (two_dim()) {  // [4, 8, 4] -> [4, 32]: both shards split evenly and stay
    const Tensor x2 = full_randn({4, 8, 4}, "x2");
    const DOp flat2 = [](const std::vector<DTensor>& t) { return dtensor::reshape(t[0], {4, -1}); };
    const FullOp flat2_ref = [](const std::vector<Tensor>& t) { return t[0].reshape({4, -1}); };
    EXPECT_EQ(check_op(mesh_2x2(), {{x2, {S0, S1}}}, flat2, flat2_ref), (Placements{S0, S1}));
  }
}

// RoPE on batch, sequence (uneven: each shard rotates at its own positions) and head shards;
// the experts' grouped matmul column-wise and row-wise.
TEST(DTensorOps, RopeAndGroupedMatmul) {
  const MeshPtr m = mesh_1d();
  const runtime::RopeTables tables = runtime::rope_frequencies(8, 16, 10000.0);
  const Tensor cos = tables.cos.to(runtime::DType::F64), sin = tables.sin.to(runtime::DType::F64);
  const Tensor x = full_randn({3, 7, 5, 8}, "x");
  const DOp rope = [cos, sin](const std::vector<DTensor>& t) {
    return dtensor::apply_rope(t[0], cos, sin, 2);
  };
  const FullOp rope_ref = [cos, sin](const std::vector<Tensor>& t) {
    return runtime::apply_rope(t[0], cos, sin, 2);
  };
  EXPECT_EQ(check_op(m, {{x, {S0}}}, rope, rope_ref), Placements{S0});
  EXPECT_EQ(check_op(m, {{x, {S1}}}, rope, rope_ref), Placements{S1});
  EXPECT_EQ(check_op(m, {{x, {S2}}}, rope, rope_ref), Placements{S2});
  EXPECT_EQ(check_op(m, {{x, {R}}}, rope, rope_ref), Placements{R});
  if (two_dim()) {
    EXPECT_EQ(check_op(mesh_2x2(), {{x, {S1, S2}}}, rope, rope_ref), (Placements{S1, S2}));
  }

  const std::vector<int64_t> counts = {3, 0, 4};
  const Tensor rows = full_randn({7, 6}, "rows"), w = full_randn({3, 5, 6}, "experts");
  const DOp gmm = [counts](const std::vector<DTensor>& t) {
    return dtensor::grouped_mm(t[0], t[1], counts);
  };
  const FullOp gmm_ref = [counts](const std::vector<Tensor>& t) {
    return runtime::grouped_mm(t[0], t[1], counts);
  };
  EXPECT_EQ(check_op(m, {{rows, {R}}, {w, {S1}}}, gmm, gmm_ref), Placements{S1});
  EXPECT_EQ(check_op(m, {{rows, {S1}}, {w, {S2}}}, gmm, gmm_ref), Placements{P});
  EXPECT_EQ(check_op(m, {{rows, {R}}, {w, {R}}}, gmm, gmm_ref), Placements{R});
}

// ---- errors ----------------------------------------------------------------------------------

TEST(DTensorOps, OpsWithoutAStrategyAreErrorsNamingTheOp) {
  const MeshPtr m = mesh_1d();
  const Tensor full = full_randn({5, 7}, "x");
  const DTensor x = distribute_tensor(full, m, {S0});
  // No rule at all.
  std::string e = error_of([&] { choose_strategy("test.never_registered", {&x}); });
  expect_contains(e, "no sharding rule is registered for op 'test.never_registered'");
  // A rule none of whose strategies the input can reach: a Shard cannot become Partial(max).
  register_op_rule("test.max_only", {[](const std::vector<Shape>&, const OpArgs&) {
                                       return std::vector<DimStrategy>{
                                           {{Partial{ReduceOp::Max}}, Partial{ReduceOp::Max}}};
                                     },
                                     [](const std::vector<Shape>& s, const OpArgs&) { return s[0]; }});
  e = error_of([&] {
    dispatch("test.max_only", {x}, {}, [](const std::vector<Tensor>& l, const MeshStrategy&) {
      return l[0];
    });
  });
  expect_contains(e, "DTensor op 'test.max_only' has no sharding strategy for inputs [Shard(0)]");
  expect_contains(e, m->describe());
  // Inputs that do not fit the op.
  const DTensor b = distribute_tensor(full_randn({5}, "b"), m, {R});
  expect_contains(error_of([&] { dtensor::add(x, b); }), "DTensor add: b of shape");
  const DTensor w = distribute_tensor(full_randn({3, 5}, "w"), m, {R});
  expect_contains(error_of([&] { dtensor::linear(x, w); }), "DTensor linear");
  const MeshPtr other = mesh_1d();
  const DTensor y = distribute_tensor(full, other, {S0});
  expect_contains(error_of([&] { dtensor::add(x, y); }), "inputs on different meshes");
}

}  // namespace
}  // namespace mt::parallel
