// Raw-id kv tables in the sharded collection (mpirun -np 2): ids are arbitrary 64-bit keys, routed
// by hash (row_wise, table_row_wise) or whole (table_wise).
// - ids below num_embeddings: a raw-id table trains BITWISE like the in-memory table (1 rank
//   row_wise, 2 ranks table_wise: the same routing), also with the caches' rows in a tensor (the
//   layout a GPU keeps in device memory);
// - scrambled ids up to 2^62: 2 ranks (row_wise, table_wise, table_row_wise) train like 1 rank;
// - checkpoints hold the stored rows only ([N] ids, [N, dim] rows, N = the distinct ids trained)
//   and load on 1 rank and on 2 ranks under other plans, continuing like the uninterrupted run; a
//   dense (memory-table) checkpoint loads into raw-id tables bitwise;
// - errors: a raw-id checkpoint into a row-keyed table, column_wise raw-id tables, empty row blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/index.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/embedding/sharded_embedding_bag_collection.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/errors.h"
#include "tests/testing/mpi_fixtures.h"
#include "tests/testing/sharding_fixtures.h"
#include "tests/testing/tensor_testing.h"
#include "train/embedding_checkpoint.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
using parallel::EmbeddingBagConfig;
using parallel::ProcessGroup;
using parallel::ReduceOp;
using parallel::ShardedEmbeddingBagCollection;
using parallel::ShardingPlan;
using parallel::ShardingType;
using runtime::DType;
using runtime::Tensor;
using runtime::sparse::EmbOptimType;
using runtime::sparse::KeyedJaggedTensor;
using runtime::sparse::TableStorage;

constexpr int64_t kGlobalBatch = 8;  // samples per step, split evenly over the ranks
constexpr int64_t kPool = 40;        // distinct ids per table (rows repeat over steps)

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(parallel::MpiProcessGroup::world());
  return pg;
}

// This rank alone. Collective the first time: every test calls it on every rank first.
std::shared_ptr<ProcessGroup> self() {
  static std::shared_ptr<ProcessGroup> pg(world()->split(int(world()->rank()), 0));
  return pg;
}

EmbeddingBagConfig table(std::string name, int64_t dim, std::string feature, EmbOptimType opt,
                         bool raw) {
  EmbeddingBagConfig c;
  c.name = std::move(name);
  c.num_embeddings = 64;  // raw-id tables: the rows they are expected to hold
  c.embedding_dim = dim;
  c.feature_names = {std::move(feature)};
  c.optimizer.type = opt;
  c.optimizer.lr = opt == EmbOptimType::RowwiseAdagrad ? 0.2 : 0.05;
  c.optimizer.eps = 1e-6;
  c.storage = raw ? TableStorage::Kv : TableStorage::Memory;
  c.raw_ids = raw;
  c.kv_cache.rows = 5;  // smaller than a step's rows
  return c;
}

std::vector<EmbeddingBagConfig> tables(bool raw) {
  return {table("t_rw", 4, "a", EmbOptimType::RowwiseAdagrad, raw),
          table("t_tw", 3, "b", EmbOptimType::Adam, raw),
          table("t_twrw", 2, "c", EmbOptimType::PartialRowwiseAdam, raw)};
}

// Id k of table t's pool: k itself (small), or a scrambled id below 2^62 (large).
int64_t pool_id(size_t t, int64_t k, bool large) {
  return large ? int64_t(testing::mix64(uint64_t(k) + 1000 * t) >> 2) : k;
}

// Samples [lo, hi) of the global batch of `step`: 0..3 ids per feature and sample, from the
// table's pool, so any split of the samples over ranks sees the same data.
KeyedJaggedTensor batch(int64_t step, int64_t lo, int64_t hi, bool large) {
  std::vector<std::string> keys = {"a", "b", "c"};
  std::vector<int64_t> values, lengths;
  for (size_t t = 0; t < keys.size(); ++t)
    for (int64_t b = lo; b < hi; ++b) {
      uint64_t s = testing::mix64(uint64_t(step) * 1000003 + uint64_t(b) * 101 + t);
      const int64_t len = int64_t(s % 4);
      lengths.push_back(len);
      for (int64_t i = 0; i < len; ++i) {
        s = testing::mix64(s);
        values.push_back(pool_id(t, int64_t(s % uint64_t(kPool)), large));
      }
    }
  return KeyedJaggedTensor::from_lengths(keys, values, lengths, {}, hi - lo);
}

// The distinct ids of table t in steps [0, steps).
int64_t distinct_ids(size_t t, int64_t steps, bool large) {
  std::set<int64_t> ids;
  for (int64_t s = 0; s < steps; ++s) {
    const KeyedJaggedTensor kjt = batch(s, 0, kGlobalBatch, large);
    const int64_t k = int64_t(t);
    const std::vector<int64_t> v = kjt.values().to_vector<int64_t>();
    const std::vector<int64_t> o = kjt.offsets().to_vector<int64_t>();
    ids.insert(v.begin() + o[size_t(k * kGlobalBatch)], v.begin() + o[size_t((k + 1) * kGlobalBatch)]);
  }
  return int64_t(ids.size());
}

// One fused step on this rank's share of the global batch; the loss summed over the group.
double train_step(ShardedEmbeddingBagCollection& ebc, int64_t step, bool large) {
  ProcessGroup& g = ebc.group();
  const int64_t per = kGlobalBatch / g.size();
  const int64_t lo = per * g.rank();
  const Tensor dense = testing::randn64({9, 3}, 500, false, "dense");
  const Tensor pooled = ebc(batch(step, lo, lo + per, large)).values;
  const Tensor loss = runtime::sum(runtime::square(runtime::tanh(runtime::matmul(pooled, dense))));
  loss.backward();
  Tensor total =
      runtime::from_vector<double>({loss.item<double>()}, {1}, runtime::TensorOptions{}.with_dtype(DType::F64));
  g.all_reduce(total, ReduceOp::Sum, "test.loss");
  return total.item<double>();
}

// The (node, local) = (1, 2) mesh of the 2-rank table_row_wise plans (collective, once).
std::shared_ptr<parallel::DeviceMesh> node_mesh() {
  static std::shared_ptr<parallel::DeviceMesh> mesh =
      parallel::DeviceMesh::create(world(), {1, 2}, {"node", "local"});
  return mesh;
}

// Plan `variant` for `ranks` ranks: 0 = row_wise / table_wise (rank 1) / table_row_wise,
// 1 = table_wise (rank 0) / row_wise / row_wise; every table table_wise on one rank.
ShardingPlan plan_for(const std::vector<EmbeddingBagConfig>& t, int ranks, int variant) {
  ShardingPlan p;
  p.world_size = ranks;
  auto& m = p.tables;
  if (ranks == 1) {
    for (const auto& c : t) m[c.name] = parallel::table_wise_sharding(c, 0);
  } else if (variant == 0) {
    m["t_rw"] = parallel::row_wise_sharding(t[0], 2);
    m["t_tw"] = parallel::table_wise_sharding(t[1], 1);
    m["t_twrw"] = parallel::table_row_wise_sharding(t[2], 0, 2);
    p.local_size = 2;
  } else {
    m["t_rw"] = parallel::table_wise_sharding(t[0], 0);
    m["t_tw"] = parallel::row_wise_sharding(t[1], 2);
    m["t_twrw"] = parallel::row_wise_sharding(t[2], 2);
  }
  return p;
}

// `tensor_cache`: the kv caches' rows in a tensor (the layout a GPU keeps in device memory).
std::unique_ptr<ShardedEmbeddingBagCollection> collection(
    const std::vector<EmbeddingBagConfig>& t, std::shared_ptr<ProcessGroup> group, int variant,
    const fs::path& kv_path, bool tensor_cache = false) {
  runtime::sparse::CollectionOptions o;
  o.dtype = DType::F64;
  o.kv.path = kv_path.string();
  o.kv.tensor_cache = tensor_cache;
  const bool twrw = group->size() == 2 && variant == 0;
  auto ebc = std::make_unique<ShardedEmbeddingBagCollection>(
      t, plan_for(t, group->size(), variant), group, twrw ? node_mesh() : nullptr, o);
  ebc->init_weights(7);
  ebc->train();
  return ebc;
}

std::vector<double> losses(ShardedEmbeddingBagCollection& ebc, int64_t from, int64_t to,
                           bool large) {
  std::vector<double> out;
  for (int64_t s = from; s < to; ++s) out.push_back(train_step(ebc, s, large));
  return out;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-10 * (1 + std::abs(want[i]))) << what << ", step " << i;
}

void guarded(const std::function<void()>& f) { testing::guarded(world()->rank(), f); }

fs::path rank_dir(const fs::path& dir, const std::string& what) {
  return dir / (what + "_r" + std::to_string(world()->rank()));
}

TEST(EmbeddingRawIds, SmallIdsTrainBitwiseLikeMemoryTables) {
  ASSERT_EQ(world()->size(), 2) << "run with mpirun -np 2";
  const auto alone = self();
  const fs::path dir = testing::shared_dir(*world(), "mt_raw_ids", "bitwise");
  // 1 rank (every table whole on it), and 2 ranks with the tables where the memory plan sends
  // every id of a table to one owner (table_wise both ways).
  guarded([&] {
    auto memory = collection(tables(false), alone, 0, rank_dir(dir, "m1"));
    auto raw = collection(tables(true), alone, 0, rank_dir(dir, "r1"));
    auto raw_tensor_cache = collection(tables(true), alone, 0, rank_dir(dir, "t1"), true);
    const std::vector<double> want = losses(*memory, 0, 5, false);
    EXPECT_EQ(losses(*raw, 0, 5, false), want);
    EXPECT_EQ(losses(*raw_tensor_cache, 0, 5, false), want);  // the device-memory layout
  });
  world()->barrier("test.one_rank");
  auto memory = collection(tables(false), world(), 1, dir / "m2");
  auto raw = collection(tables(true), world(), 1, dir / "r2");
  const std::vector<double> m = losses(*memory, 0, 5, false);
  // t_rw is table_wise in plan 1; t_tw and t_twrw are row_wise (memory: by row block, raw: by
  // hash), so their bags' partial sums add in another order: float tolerance.
  expect_near(losses(*raw, 0, 5, false), m, "2 ranks");
}

TEST(EmbeddingRawIds, LargeIdsOnTwoRanksTrainLikeOneRank) {
  const auto alone = self();
  const fs::path dir = testing::shared_dir(*world(), "mt_raw_ids", "large");
  std::vector<double> one;
  guarded([&] { one = losses(*collection(tables(true), alone, 0, rank_dir(dir, "one")), 0, 6, true); });
  world()->barrier("test.one_rank");
  for (int variant : {0, 1}) {
    SCOPED_TRACE("plan " + std::to_string(variant));
    auto two = collection(tables(true), world(), variant, dir / ("two" + std::to_string(variant)));
    expect_near(losses(*two, 0, 6, true), one, "2 ranks");
    // Each stored row belongs to its shard: the shards' rows add up to the distinct ids trained.
    two->flush_kv();
    for (const parallel::LocalShard& s : two->local_shards()) {
      const runtime::sparse::KvStoredRows rows =
          s.kv->read_stored(0, std::numeric_limits<int64_t>::max(), nullptr);
      for (int64_t id : rows.ids) EXPECT_TRUE(s.kv->owns(id)) << s.table << " id " << id;
    }
  }
}

void save(const ShardedEmbeddingBagCollection& ebc, const fs::path& dir) {
  checkpoint::CheckpointState state;
  add_embedding_pieces(ebc, "model.", "optimizer.", state);
  checkpoint::save_checkpoint(dir, state, ebc.group());
}

void load_into(ShardedEmbeddingBagCollection& ebc, const fs::path& dir) {
  checkpoint::CheckpointState dest;
  const EmbeddingLoadPlan plan = embedding_load_template(
      ebc, checkpoint::read_index(dir / checkpoint::kIndexFileName), "model.", "optimizer.", dest);
  checkpoint::load_checkpoint(dir, dest, ebc.group());
  apply_loaded_embeddings(ebc, plan, dest);
}

TEST(EmbeddingRawIds, CheckpointsHoldTheStoredRowsAndReshard) {
  const auto alone = self();
  const fs::path dir = testing::shared_dir(*world(), "mt_raw_ids", "checkpoint");
  constexpr int64_t kSaved = 3, kMore = 3;
  const fs::path ckpt = dir / "step-3";
  auto a = collection(tables(true), world(), 0, dir / "a");
  losses(*a, 0, kSaved, true);
  save(*a, ckpt);
  const std::vector<double> uninterrupted = losses(*a, kSaved, kSaved + kMore, true);

  // The sparse layout: the distinct ids trained, rows and optimizer state beside them.
  const checkpoint::Index index = checkpoint::read_index(ckpt / checkpoint::kIndexFileName);
  auto shape_of = [&](const std::string& fqn) {
    for (const auto& c : index.chunks)
      if (c.meta.fqn == fqn) return c.meta.global_shape;
    return runtime::Shape{};
  };
  const std::vector<std::string> names = {"t_rw", "t_tw", "t_twrw"};
  for (size_t t = 0; t < names.size(); ++t) {
    const int64_t n = distinct_ids(t, kSaved, true);
    const std::string fqn = "embedding_bags." + names[t] + ".weight";
    EXPECT_EQ(shape_of("model.embedding_bags." + names[t] + ".ids"), (runtime::Shape{n}));
    EXPECT_EQ(shape_of("model." + fqn), (runtime::Shape{n, tables(true)[t].embedding_dim}));
    EXPECT_EQ(std::get<int64_t>(index.values.at("optimizer.state." + fqn + ".raw_id_rows")), n);
  }
  EXPECT_EQ(shape_of("optimizer.state.embedding_bags.t_rw.weight.momentum1"),
            (runtime::Shape{distinct_ids(0, kSaved, true)}));

  guarded([&] {  // one rank
    auto b = collection(tables(true), alone, 0, rank_dir(dir, "one"));
    load_into(*b, ckpt);
    expect_near(losses(*b, kSaved, kSaved + kMore, true), uninterrupted, "loaded on 1 rank");
  });
  world()->barrier("test.one_rank");
  auto c = collection(tables(true), world(), 1, dir / "other_plan");
  load_into(*c, ckpt);
  expect_near(losses(*c, kSaved, kSaved + kMore, true), uninterrupted, "2 ranks, other plan");

  // A memory-table checkpoint loads into raw-id tables as ids 0..rows-1.
  auto m = collection(tables(false), world(), 1, dir / "memory");
  losses(*m, 0, kSaved, false);
  save(*m, dir / "memory-step-3");
  const std::vector<double> memory_more = losses(*m, kSaved, kSaved + kMore, false);
  auto r = collection(tables(true), world(), 1, dir / "dense_to_raw");
  load_into(*r, dir / "memory-step-3");
  expect_near(losses(*r, kSaved, kSaved + kMore, false), memory_more, "dense into raw");

  // A raw-id checkpoint does not load into row-keyed tables.
  auto rows = collection(tables(false), world(), 1, dir / "raw_to_memory");
  EXPECT_NE(testing::error_of([&] { load_into(*rows, ckpt); }).find("keys it by raw ids"),
            std::string::npos);
  world()->barrier("test.done");
}

TEST(EmbeddingRawIds, BadPlansAreRefused) {
  const fs::path dir = testing::shared_dir(*world(), "mt_raw_ids", "errors");
  auto t = tables(true);
  runtime::sparse::CollectionOptions o;
  o.kv.path = (dir / "kv").string();
  ShardingPlan column = plan_for(t, 2, 1);
  column.tables["t_rw"] = parallel::column_wise_sharding(t[0], {0, 1});
  EXPECT_NE(testing::error_of([&] { ShardedEmbeddingBagCollection(t, column, world(), nullptr, o); })
                .find("cannot be column_wise"),
            std::string::npos);
  auto tiny = t;
  tiny[1].num_embeddings = 1;  // row_wise over 2 ranks: one empty row block
  EXPECT_NE(testing::error_of([&] {
              ShardedEmbeddingBagCollection(tiny, plan_for(tiny, 2, 1), world(), nullptr, o);
            }).find("empty row block"),
            std::string::npos);
  world()->barrier("test.done");
}

}  // namespace
}  // namespace mt::train
