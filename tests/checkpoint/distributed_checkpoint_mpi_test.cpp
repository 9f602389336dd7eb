// Distributed checkpoints across layouts, on real ranks: tensors saved sharded (FSDP-like Shard(0)
// on every rank, or HSDP [Replicate, Shard(0)] on a 2x2 mesh) load into other layouts (Shard(0),
// Shard(1), Replicate) on 1, 2 and 3 ranks, with the values checked exactly; replicated pieces
// are written once; a flipped byte and a strict mismatch fail on every rank.
#include <gtest/gtest.h>

#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/index.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/comm/object_collectives.h"
#include "parallel/mesh/device_mesh.h"
#include "parallel/mesh/dtensor.h"
#include "runtime/ops/factory.h"
#include "tests/testing/hdf5_corruption.h"
#include "tests/testing/scratch_dir.h"

namespace mt::checkpoint {
namespace {

namespace fs = std::filesystem;
using parallel::DeviceMesh;
using parallel::Placement;
using parallel::ProcessGroup;
using parallel::Replicate;
using parallel::Shard;
using runtime::DType;
using runtime::Shape;
using runtime::Tensor;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> w(parallel::MpiProcessGroup::world());
  return w;
}

struct Spec {
  std::string fqn;
  Shape shape;
  DType dtype;
};

// Uneven sizes on purpose (7 and 10 rows over 2, 3 and 4 ranks), every dtype kind, a 0-d scalar.
const std::vector<Spec>& specs() {
  static const std::vector<Spec> s = {
      {"model.w", {10, 6}, DType::F32},
      {"model.b", {7}, DType::BF16},
      {"optimizer.m", {5, 3, 2}, DType::F64},
      {"optimizer.step", {}, DType::I64},
  };
  return s;
}

// The whole tensor: element i holds (i % 97) + salt, exact in every dtype used here.
Tensor global_value(const Spec& s, int salt) {
  const int64_t n = runtime::numel_of(s.shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i % 97 + salt);
  return runtime::from_f64(v, s.shape, {s.dtype});
}

Tensor region(const Tensor& whole, const Shape& offset, const Shape& sizes) {
  Tensor t = whole;
  for (size_t d = 0; d < sizes.size(); ++d) t = t.narrow(int64_t(d), offset[d], sizes[d]);
  return t.contiguous();
}

// This rank's pieces of every tensor under `placements` on `mesh` (scalars replicated).
CheckpointState pieces(const std::shared_ptr<DeviceMesh>& mesh,
                       const std::vector<Placement>& placements, int salt, bool empty_locals) {
  CheckpointState state;
  for (const Spec& s : specs()) {
    std::vector<Placement> p = placements;  // Shard(d) of a tensor with <= d dims: replicated
    for (Placement& x : p) {
      if (auto* shard = std::get_if<Shard>(&x); shard && shard->dim >= int64_t(s.shape.size())) {
        x = Replicate{};
      }
    }
    const parallel::LocalPiece piece = parallel::local_piece(s.shape, *mesh, p);
    Tensor local = empty_locals ? runtime::zeros(piece.shape, {s.dtype})
                                : region(global_value(s, salt), piece.offset, piece.shape);
    state.tensors.push_back({s.fqn, local, s.shape, piece.offset});
  }
  return state;
}

void expect_loaded(const CheckpointState& state, int salt) {
  for (size_t i = 0; i < specs().size(); ++i) {
    const TensorPiece& p = state.tensors[i];
    const Tensor want = region(global_value(specs()[i], salt), p.global_offset, p.local.shape());
    const Tensor a = p.local.to(DType::F64).contiguous(), b = want.to(DType::F64).contiguous();
    ASSERT_EQ(a.shape(), b.shape()) << p.fqn;
    for (int64_t k = 0; k < a.numel(); ++k) {
      ASSERT_EQ(a.data<double>()[k], b.data<double>()[k]) << p.fqn << " element " << k;
    }
  }
}

// One folder for all ranks: rank 0's scratch path.
fs::path shared_folder(const testing::ScratchDir& scratch) {
  return parallel::all_gather_strings(*world(), scratch.path().string(), "test.folder")[0];
}

// Loads `dir` on the first `ranks` ranks with `placement` over a 1-D mesh of them.
void load_on_subworld(const fs::path& dir, int ranks, const Placement& placement, int salt) {
  const bool member = world()->rank() < ranks;
  std::shared_ptr<ProcessGroup> sub(world()->split(member ? 0 : 1, world()->rank()));
  if (!member) return;
  auto mesh = DeviceMesh::create(sub, {ranks}, {"dp"});
  CheckpointState dest = pieces(mesh, {placement}, salt, /*empty_locals=*/true);
  dest.per_rank_group = "loader";
  LoadReport report = load_checkpoint(dir, dest, *sub);
  expect_loaded(dest, salt);
  ASSERT_EQ(report.per_rank_values.size(), size_t(world()->size()));
  for (int r = 0; r < world()->size(); ++r) {
    EXPECT_EQ(std::get<int64_t>(report.per_rank_values[size_t(r)].at("position")), 100 + r);
  }
  EXPECT_EQ(std::get<int64_t>(report.values.at("step")), 42);
  EXPECT_EQ(std::get<std::string>(report.values.at("note")), "multi\nline");
}

void save_with(const fs::path& dir, const std::shared_ptr<DeviceMesh>& mesh,
               const std::vector<Placement>& placements, int salt) {
  CheckpointState state = pieces(mesh, placements, salt, false);
  state.values["step"] = int64_t(42);
  state.values["note"] = std::string("multi\nline");
  state.per_rank_group = "loader";
  state.per_rank_values["position"] = int64_t(100 + world()->rank());
  save_checkpoint(dir, state, *world());
}

// Every rank uses rank 0's scratch folder; the barrier keeps it until every rank is done.
class DistributedCheckpoint : public ::testing::Test {
 protected:
  void TearDown() override { world()->barrier("test.end"); }
  testing::ScratchDir scratch;
};

TEST_F(DistributedCheckpoint, ShardedSaveLoadsIntoEveryLayoutAndWorldSize) {
  const fs::path dir = shared_folder(scratch) / "step-1";
  auto mesh = DeviceMesh::create(world(), {world()->size()}, {"dp"});
  save_with(dir, mesh, {Shard{0}}, 3);
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
  for (int ranks = 1; ranks <= std::min(3, world()->size()); ++ranks) {
    for (const Placement& p : {Placement{Shard{0}}, Placement{Shard{1}}, Placement{Replicate{}}}) {
      SCOPED_TRACE(::testing::Message() << ranks << " ranks, " << parallel::placement_name(p));
      load_on_subworld(dir, ranks, p, 3);
    }
  }
  // Replicated scalars are written once, by one rank.
  const Index index = read_index(dir / kIndexFileName);
  int scalar_chunks = 0;
  for (const IndexChunk& c : index.chunks) scalar_chunks += c.meta.fqn == "optimizer.step";
  EXPECT_EQ(scalar_chunks, 1);
}

TEST_F(DistributedCheckpoint, HsdpSaveWritesEachShardOnceAndReshards) {
  if (world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const fs::path dir = shared_folder(scratch) / "step-1";
  auto mesh = DeviceMesh::create(world(), {2, 2}, {"dp_replicate", "dp_shard"});
  save_with(dir, mesh, {Replicate{}, Shard{0}}, 5);
  const Index index = read_index(dir / kIndexFileName);
  std::map<std::string, int> chunks;
  std::map<std::string, int> writers;
  for (const IndexChunk& c : index.chunks) {
    chunks[c.meta.fqn] += 1;
    writers[c.file] += 1;
  }
  EXPECT_EQ(chunks["model.w"], 2);  // 2 shards, each held by 2 replicas, written once
  EXPECT_EQ(chunks["optimizer.step"], 1);
  EXPECT_EQ(writers.size(), 4u) << "the duplicated shards are spread over the 4 ranks";
  for (int ranks : {1, 2, 3}) {
    SCOPED_TRACE(ranks);
    load_on_subworld(dir, ranks, Shard{0}, 5);
  }
}

TEST_F(DistributedCheckpoint, FlippedByteFailsEveryRankNamingFileAndTensor) {
  const fs::path dir = shared_folder(scratch) / "step-1";
  auto mesh = DeviceMesh::create(world(), {world()->size()}, {"dp"});
  save_with(dir, mesh, {Shard{0}}, 1);
  const Index index = read_index(dir / kIndexFileName);
  const IndexChunk* victim = nullptr;
  for (const IndexChunk& c : index.chunks) {
    if (c.meta.fqn == "model.w") victim = &c;
  }
  ASSERT_NE(victim, nullptr);
  if (world()->rank() == 0) testing::flip_dataset_byte(dir / victim->file, victim->dataset, 4);
  world()->barrier("test.flipped");
  CheckpointState dest = pieces(mesh, {Shard{0}}, 1, true);
  try {
    load_checkpoint(dir, dest, *world());
    FAIL() << "a corrupted checkpoint loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(victim->file), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.w"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
  }
}

TEST_F(DistributedCheckpoint, StrictMismatchesAreOneErrorNonStrictReports) {
  const fs::path dir = shared_folder(scratch) / "step-1";
  auto mesh = DeviceMesh::create(world(), {world()->size()}, {"dp"});
  save_with(dir, mesh, {Shard{0}}, 2);
  CheckpointState dest = pieces(mesh, {Shard{0}}, 2, true);
  dest.tensors[0].global_shape = {11, 6};  // another model size
  dest.tensors.erase(dest.tensors.begin() + 1);            // model.b not wanted
  dest.tensors.push_back(whole("model.extra", runtime::zeros({2}, {DType::F32})));
  try {
    load_checkpoint(dir, dest, *world());
    FAIL() << "a mismatched checkpoint loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("3 problems"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor model.w: saved with shape [10, 6], wanted [11, 6]"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("tensor model.extra: not in the checkpoint"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor model.b: in the checkpoint but not in this job"), std::string::npos)
        << msg;
  }
  CheckpointState lenient = pieces(mesh, {Shard{0}}, 2, true);
  lenient.tensors.erase(lenient.tensors.begin() + 1);
  lenient.tensors.push_back(whole("model.extra", runtime::zeros({2}, {DType::F32})));
  LoadOptions options;
  options.strict = false;
  LoadReport report = load_checkpoint(dir, lenient, *world(), options);
  EXPECT_EQ(report.missing, std::vector<std::string>{"model.extra"});
  EXPECT_EQ(report.unexpected, std::vector<std::string>{"model.b"});
}

}  // namespace
}  // namespace mt::checkpoint
