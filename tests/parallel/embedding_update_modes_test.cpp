// Table update modes of the sharded collection (one rank), for in-memory and kv-backed tables:
// frozen tables do not change, writeback tables hold exactly the values written, a table shared
// by two features with update_features = {one of them} changes only the rows that feature hit
// (bitwise as a table only that feature reads), and the row listener hears of exactly the rows
// that changed, with their new values.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "parallel/comm/mpi_process_group.h"
#include "parallel/embedding/sharded_embedding_bag_collection.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/sharding_fixtures.h"

namespace mt::parallel {
namespace {

using runtime::Tensor;
using runtime::sparse::KeyedJaggedTensor;
using runtime::sparse::TableStorage;
using runtime::sparse::TableUpdate;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(MpiProcessGroup::world());
  return pg;
}

EmbeddingBagConfig table(const std::string& name, std::vector<std::string> features,
                         TableUpdate update, TableStorage storage) {
  EmbeddingBagConfig c;
  c.name = name;
  c.num_embeddings = 40;
  c.embedding_dim = 4;
  c.feature_names = std::move(features);
  c.optimizer.type = runtime::sparse::EmbOptimType::RowwiseAdagrad;
  c.optimizer.lr = 0.5;
  c.update = update;
  c.storage = storage;
  c.kv_cache.rows = 3;  // smaller than a batch's rows
  return c;
}

std::unique_ptr<ShardedEmbeddingBagCollection> collection(std::vector<EmbeddingBagConfig> tables,
                                                          const std::string& kv_path) {
  runtime::sparse::CollectionOptions o;
  o.kv.path = kv_path;
  auto plan = testing::uniform_sharding_plan(tables, ShardingType::TableWise, 1, 1);
  auto ebc = std::make_unique<ShardedEmbeddingBagCollection>(tables, plan, world(), nullptr, o);
  ebc->init_weights(11);
  return ebc;
}

// The table's rows [40, 4] (kv tables read from their store).
std::vector<float> rows_of(ShardedEmbeddingBagCollection& ebc, const std::string& name) {
  ebc.flush_kv();
  for (const LocalShard& s : ebc.local_shards()) {
    if (s.table != name) continue;
    if (!s.kv) return s.weight.to_vector<float>();
    const Tensor w = runtime::empty({40, 4});
    std::vector<Tensor> state;
    for (const auto& [field, width] : s.kv->state_fields())
      state.push_back(runtime::empty({40, width}));
    s.kv->read_rows(0, 40, w, state, nullptr);
    return w.to_vector<float>();
  }
  ADD_FAILURE() << "no shard " << name;
  return {};
}

std::vector<float> row(const std::vector<float>& rows, int64_t r) {
  return {rows.begin() + r * 4, rows.begin() + (r + 1) * 4};
}

// Four features, batch 3; each bag one id (writeback: one id per row and bag).
//   a, b -> "shared" (update_features = {a}); c -> "written"; d -> "frozen"
KeyedJaggedTensor batch() {
  return KeyedJaggedTensor::from_lengths({"a", "b", "c", "d"},
                                         {1, 5, 7, /*b*/ 5, 9, 12, /*c*/ 2, 3, 30, /*d*/ 1, 2, 3},
                                         std::vector<int64_t>(12, 1));
}

// out * G summed: the gradient reaching feature f's bag i is G[i, f's columns].
Tensor upstream() {
  std::vector<float> g(3 * 16);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * float(int(i % 7) - 3);
  return runtime::from_vector<float>(g, {3, 16});
}

class UpdateModes : public ::testing::TestWithParam<TableStorage> {};

TEST_P(UpdateModes, FrozenWritebackAndSelectiveUpdates) {
  testing::ScratchDir dir;
  const TableStorage storage = GetParam();
  auto shared = table("shared", {"a", "b"}, TableUpdate::Train, storage);
  shared.update_features = {"a"};
  auto ebc = collection({shared, table("written", {"c"}, TableUpdate::Writeback, storage),
                         table("frozen", {"d"}, TableUpdate::Frozen, storage)},
                        (dir.path() / "kv").string());
  // The reference: the shared table read by `a` alone (b's lookup goes to a frozen copy).
  auto only_a = table("shared", {"a"}, TableUpdate::Train, TableStorage::Memory);
  auto b_copy = table("b_copy", {"b"}, TableUpdate::Frozen, TableStorage::Memory);
  auto ref = collection({only_a, b_copy}, (dir.path() / "kv_ref").string());

  std::map<std::string, std::set<int64_t>> reported;
  std::map<std::string, std::vector<float>> reported_values;
  ebc->set_row_update_listener(
      [&](std::vector<runtime::sparse::RowUpdate>&& updates) {
        for (const auto& u : updates) {
          reported[u.table].insert(u.rows.begin(), u.rows.end());
          reported_values[u.table] = u.values.to_vector<float>();
        }
      },
      false);

  const std::vector<float> shared0 = rows_of(*ebc, "shared");
  const std::vector<float> frozen0 = rows_of(*ebc, "frozen");
  ASSERT_EQ(shared0, rows_of(*ref, "shared"));  // same init
  ebc->train();
  ref->train();
  const Tensor out = (*ebc)(batch()).values;
  runtime::sum(runtime::mul(out, upstream())).backward();
  const KeyedJaggedTensor ref_batch = KeyedJaggedTensor::from_lengths(
      {"a", "b"}, {1, 5, 7, 5, 9, 12}, std::vector<int64_t>(6, 1));
  const Tensor ref_out = (*ref)(ref_batch).values;
  runtime::sum(runtime::mul(ref_out, upstream().narrow(1, 0, 8))).backward();

  // Selective: exactly the reference's rows (bitwise); rows only b hit (9, 12) unchanged.
  const std::vector<float> shared1 = rows_of(*ebc, "shared");
  EXPECT_EQ(shared1, rows_of(*ref, "shared"));
  for (int64_t r : {9, 12}) EXPECT_EQ(row(shared1, r), row(shared0, r)) << "row " << r;
  for (int64_t r : {1, 5, 7}) EXPECT_NE(row(shared1, r), row(shared0, r)) << "row " << r;
  // Writeback: row id of bag i holds G[i, c's columns 8..11].
  const std::vector<float> written = rows_of(*ebc, "written");
  const std::vector<float> g = upstream().to_vector<float>();
  const int64_t ids[] = {2, 3, 30};
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_EQ(row(written, ids[i]),
              std::vector<float>(g.begin() + i * 16 + 8, g.begin() + i * 16 + 12))
        << "row " << ids[i];
  EXPECT_EQ(rows_of(*ebc, "frozen"), frozen0);
  // The listener: the changed rows only, with their new values.
  EXPECT_EQ(reported["shared"], (std::set<int64_t>{1, 5, 7}));
  EXPECT_EQ(reported["written"], (std::set<int64_t>{2, 3, 30}));
  EXPECT_EQ(reported.count("frozen"), 0u);
  std::vector<float> expected;
  for (int64_t r : {2, 3, 30}) {
    const auto v = row(written, r);
    expected.insert(expected.end(), v.begin(), v.end());
  }
  EXPECT_EQ(reported_values["written"], expected);
}

INSTANTIATE_TEST_SUITE_P(Storage, UpdateModes,
                         ::testing::Values(TableStorage::Memory, TableStorage::Kv),
                         [](const auto& info) {
                           return info.param == TableStorage::Kv ? "Kv" : "Memory";
                         });

TEST(KvCollection, RefusesDataParallelAndAMissingPath) {
  testing::ScratchDir dir;
  auto t = table("t", {"a"}, TableUpdate::Train, TableStorage::Kv);
  runtime::sparse::CollectionOptions o;
  o.kv.path = (dir.path() / "kv").string();
  auto dp = testing::uniform_sharding_plan({t}, ShardingType::DataParallel, 1, 1);
  EXPECT_THROW(ShardedEmbeddingBagCollection({t}, dp, world(), nullptr, o), Error);
  o.kv.path = "";
  auto tw = testing::uniform_sharding_plan({t}, ShardingType::TableWise, 1, 1);
  EXPECT_THROW(ShardedEmbeddingBagCollection({t}, tw, world(), nullptr, o), Error);
}

}  // namespace
}  // namespace mt::parallel
