// DeviceMesh and DTensor on real ranks (mpirun -np 2 and 4): torch.chunk row ranges, row-major
// coordinates and per-dimension groups (checked by all-reducing world ranks), sub-meshes and
// flattened meshes, bad meshes as errors, and distribute_tensor -> full_tensor round trips for
// Shard(0)/Shard(1) with uneven sizes, Replicate, Partial, and 2-D placements on a 2x2 mesh.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/mpi_process_group.h"
#include "parallel/mesh/device_mesh.h"
#include "parallel/mesh/dtensor.h"
#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"

namespace mt::parallel {
namespace {

using mt::testing::error_of;
using runtime::DType;
using runtime::Tensor;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> w(MpiProcessGroup::world());
  return w;
}

// Sum over `group` of each member's world rank.
int64_t sum_of_world_ranks(ProcessGroup& group) {
  Tensor t = runtime::full({1}, double(world()->rank()), {DType::I64});
  group.all_reduce(t, ReduceOp::Sum, "test.ranks");
  return t.item<int64_t>();
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(ChunkRange, FollowsTorchChunk) {
  // torch.chunk(arange(10), 4) -> sizes 3, 3, 3, 1; chunk(arange(5), 4) -> 2, 2, 1 and an empty.
  const int64_t lengths10[] = {3, 3, 3, 1}, offsets10[] = {0, 3, 6, 9};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(chunk_range(10, 4, i).length, lengths10[i]);
    EXPECT_EQ(chunk_range(10, 4, i).offset, offsets10[i]);
    EXPECT_EQ(chunk_range(10, 4, i).padded_length, 3);
  }
  const int64_t lengths5[] = {2, 2, 1, 0};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(chunk_range(5, 4, i).length, lengths5[i]);
  EXPECT_EQ(chunk_range(5, 4, 3).offset, 5);  // clamped to the size
  EXPECT_EQ(chunk_range(2, 3, 2).length, 0);
  // chunk(arange(6), 4) -> 2, 2, 2 and an empty fourth chunk (not 2, 2, 1, 1).
  const int64_t lengths6[] = {2, 2, 2, 0};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(chunk_range(6, 4, i).length, lengths6[i]);
  EXPECT_EQ(chunk_range(0, 3, 1).length, 0);
  EXPECT_EQ(chunk_range(0, 3, 1).offset, 0);
  expect_contains(error_of([] { chunk_range(5, 4, 4); }), "num_chunks 4, index 4");
  expect_contains(error_of([] { chunk_range(5, 0, 0); }), "num_chunks 0");
}

TEST(DeviceMesh, CoordinatesAndGroupsAreRowMajor) {
  const int W = world()->size(), R = world()->rank();
  const int64_t rows = W == 4 ? 2 : 1, cols = W / rows;
  auto mesh = DeviceMesh::create(world(), {rows, cols}, {"dp_replicate", "dp_shard"});
  EXPECT_EQ(mesh->coordinate("dp_replicate"), R / cols);
  EXPECT_EQ(mesh->coordinate("dp_shard"), R % cols);
  EXPECT_EQ(mesh->rank(), R);
  EXPECT_EQ(mesh->size(), W);
  // dp_shard groups this rank's row, dp_replicate its column.
  int64_t row_sum = 0, col_sum = 0;
  for (int64_t c = 0; c < cols; ++c) row_sum += (R / cols) * cols + c;
  for (int64_t r = 0; r < rows; ++r) col_sum += r * cols + R % cols;
  EXPECT_EQ(sum_of_world_ranks(mesh->group("dp_shard")), row_sum);
  EXPECT_EQ(sum_of_world_ranks(mesh->group("dp_replicate")), col_sum);
  EXPECT_EQ(mesh->group("dp_shard").size(), cols);
  EXPECT_EQ(mesh->describe(), "DeviceMesh(dp_replicate=" + std::to_string(rows) +
                                  ", dp_shard=" + std::to_string(cols) + ")");

  auto sub = mesh->submesh({"dp_shard"});
  EXPECT_EQ(sub->ndim(), 1);
  EXPECT_EQ(sub->size(), cols);
  EXPECT_EQ(sub->coordinate(0), R % cols);
  EXPECT_EQ(sum_of_world_ranks(sub->group(0)), row_sum);

  auto flat = mesh->flatten({"dp_replicate", "dp_shard"}, "dp");
  EXPECT_EQ(flat->size(), W);
  EXPECT_EQ(flat->coordinate("dp"), R);
  EXPECT_EQ(sum_of_world_ranks(flat->group("dp")), int64_t(W) * (W - 1) / 2);
}

// The checks run before any split, so every rank throws and none waits for the others.
TEST(DeviceMesh, BadMeshesAreErrors) {
  const int W = world()->size();
  const std::string w = std::to_string(W), w1 = std::to_string(W + 1);
  std::string e = error_of([&] { DeviceMesh::create(world(), {W + 1}, {"dp"}); });
  expect_contains(e, "DeviceMesh(dp=" + w1 + ") holds " + w1 + " ranks");
  expect_contains(e, "mpi:world has " + w);
  e = error_of([&] { DeviceMesh::create(world(), {1, W}, {"dp", "dp"}); });
  expect_contains(e, "'dp' is used twice");
  e = error_of([&] { DeviceMesh::create(world(), {W}, {"dp", "ep"}); });
  expect_contains(e, "1 sizes and 2 names (dp, ep)");
  e = error_of([&] { DeviceMesh::create(world(), {0, W}, {"pp", "dp"}); });
  expect_contains(e, "'pp' has size 0");

  auto mesh = DeviceMesh::create(world(), {1, W}, {"pp", "dp"});
  e = error_of([&] { mesh->dim_index("ep"); });
  expect_contains(e, "DeviceMesh(pp=1, dp=" + w + "): no dimension named 'ep'");
  e = error_of([&] { mesh->submesh({"ep"}); });
  expect_contains(e, "no dimension named 'ep'");
  e = error_of([&] { mesh->submesh({"dp", "pp"}); });
  expect_contains(e, "in the mesh's order, got (dp, pp)");
  EXPECT_FALSE(mesh->has_dim("ep"));
  EXPECT_TRUE(mesh->has_dim("dp"));
}

// A [7, 5] f32 tensor (uneven over 2, 3 and 4 ranks), the same on every rank.
Tensor global_7x5() { return runtime::arange(0, 35, 1, {DType::F32}).reshape({7, 5}); }

// torch.chunk(arange(size), ranks)[rank] as (offset, length), written out for 7 and 5 rows.
std::pair<int64_t, int64_t> torch_chunk(int64_t size, int ranks, int rank) {
  static const std::map<std::pair<int64_t, int>, std::vector<int64_t>> lengths = {
      {{7, 2}, {4, 3}}, {{7, 3}, {3, 3, 1}}, {{7, 4}, {2, 2, 2, 1}},
      {{5, 2}, {3, 2}}, {{5, 3}, {2, 2, 1}}, {{5, 4}, {2, 2, 1, 0}}};
  const std::vector<int64_t>& l = lengths.at({size, ranks});
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += l[size_t(r)];
  return {offset, l[size_t(rank)]};
}

void expect_equal(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(a.contiguous().to_vector<double>(), b.contiguous().to_vector<double>());
}

TEST(DTensor, OneDimRoundTrips) {
  const int W = world()->size(), R = world()->rank();
  auto mesh = DeviceMesh::create(world(), {W}, {"dp"});
  const Tensor g = global_7x5();
  for (int64_t dim : {0, 1}) {
    DTensor d = distribute_tensor(g, mesh, {Shard{dim}});
    const auto [offset, length] = torch_chunk(g.size(dim), W, R);
    EXPECT_EQ(d.local.size(dim), length);
    EXPECT_EQ(d.local_offset[size_t(dim)], offset);
    EXPECT_EQ(d.local_offset[size_t(1 - dim)], 0);
    EXPECT_EQ(d.global_shape, (runtime::Shape{7, 5}));
    expect_equal(d.local, g.narrow(dim, offset, length));
    expect_equal(d.full_tensor(), g);
  }
  DTensor rep = distribute_tensor(g, mesh, {Replicate{}});
  expect_equal(rep.local, g);
  expect_equal(rep.full_tensor(), g);
  // Partial: each rank holds a part; full_tensor sums them.
  DTensor part{
      runtime::full({7, 5}, double(R + 1), {DType::F32}), mesh, {Partial{}}, {7, 5}, {0, 0}};
  expect_equal(part.full_tensor(), runtime::full({7, 5}, double(W) * (W + 1) / 2, {DType::F32}));
  // distribute_tensor: coordinate 0 holds the value, the others zeros.
  DTensor dist_partial = distribute_tensor(g, mesh, {Partial{}});
  expect_equal(dist_partial.local, R == 0 ? g : runtime::zeros({7, 5}, {DType::F32}));
  expect_equal(dist_partial.full_tensor(), g);
}

TEST(DTensor, TwoDimPlacementsOnATwoByTwoMesh) {
  if (world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int R = world()->rank();
  auto mesh = DeviceMesh::create(world(), {2, 2}, {"a", "b"});
  const Tensor g = global_7x5();
  // [Shard(0), Shard(1)]: rows split over a, columns over b.
  DTensor d = distribute_tensor(g, mesh, {Shard{0}, Shard{1}});
  // Rows 0-3 / 4-6 over a, columns 0-2 / 3-4 over b.
  EXPECT_EQ(d.local.shape(), (runtime::Shape{R / 2 == 0 ? 4 : 3, R % 2 == 0 ? 3 : 2}));
  EXPECT_EQ(d.local_offset, (runtime::Shape{R / 2 == 0 ? 0 : 4, R % 2 == 0 ? 0 : 3}));
  EXPECT_EQ(d.global_shape, (runtime::Shape{7, 5}));
  expect_equal(d.local, g.narrow(0, R / 2 == 0 ? 0 : 4, R / 2 == 0 ? 4 : 3)
                            .narrow(1, R % 2 == 0 ? 0 : 3, R % 2 == 0 ? 3 : 2));
  expect_equal(d.full_tensor(), g);
  // [Shard(0), Shard(0)]: rows split over a, then a's piece split again over b.
  DTensor nested = distribute_tensor(g, mesh, {Shard{0}, Shard{0}});
  // Rows 0-3 split into 0-1 / 2-3, rows 4-6 into 4-5 / 6.
  const int64_t nested_offsets[] = {0, 2, 4, 6}, nested_lengths[] = {2, 2, 2, 1};
  EXPECT_EQ(nested.local_offset, (runtime::Shape{nested_offsets[R], 0}));
  expect_equal(nested.local, g.narrow(0, nested_offsets[R], nested_lengths[R]));
  expect_equal(nested.full_tensor(), g);
  // HSDP: [Replicate, Shard(0)].
  DTensor hsdp = distribute_tensor(g, mesh, {Replicate{}, Shard{0}});
  const int64_t half_offset = R % 2 == 0 ? 0 : 4, half_length = R % 2 == 0 ? 4 : 3;
  EXPECT_EQ(hsdp.local_offset, (runtime::Shape{half_offset, 0}));
  expect_equal(hsdp.local, g.narrow(0, half_offset, half_length));
  expect_equal(hsdp.full_tensor(), g);
}

}  // namespace
}  // namespace mt::parallel
