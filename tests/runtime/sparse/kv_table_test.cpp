// The pieces of kv-backed embedding tables: the RocksDB store (rows by table and id, scans in row
// order, views, metadata, and its errors: a folder that cannot be made, one holding something
// else, a corrupt database), the set-associative row cache (LRU and LFU eviction), and KvTable
// (rows never seen are the in-memory table's initial values, a working set goes back through a
// cache smaller than itself, prefetched rows written meanwhile are read again, checkpoint reads
// and field writes; raw-id tables: any 64-bit id, the memory table's values below num_embeddings,
// the hash split of ids over shards, and their stored rows read back by id range).
#include "runtime/sparse/kv/kv_table.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <fstream>

#include "runtime/nn/init.h"
#include "runtime/ops/factory.h"
#include "runtime/sparse/embedding_bag_collection.h"
#include "runtime/sparse/table_collection.h"
#include "tests/testing/errors.h"
#include "tests/testing/scratch_dir.h"

namespace mt::runtime::sparse {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

std::vector<float> floats(const Tensor& t) { return t.contiguous().to_vector<float>(); }

TEST(KvStore, PutGetScanAndCount) {
  testing::ScratchDir dir;
  auto store = KvStore::open(dir.path() / "db");
  const std::vector<int64_t> keys = {7, -3, 100000000000, 0};
  std::vector<float> rows = {1, 2, 3, 4, 5, 6, 7, 8};
  store->put(1, keys, 2 * sizeof(float), reinterpret_cast<const std::byte*>(rows.data()));
  store->put(2, {7}, 2 * sizeof(float), reinterpret_cast<const std::byte*>(rows.data() + 6));
  std::vector<float> out(6, -1);
  const std::vector<bool> found = store->multi_get(1, {0, 8, 7}, 2 * sizeof(float),
                                                   reinterpret_cast<std::byte*>(out.data()));
  EXPECT_EQ(found, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(out[0], 7);
  EXPECT_EQ(out[1], 8);
  EXPECT_EQ(out[4], 1);  // table 1's row 7, not table 2's
  std::vector<int64_t> order;
  store->scan(1, -5, 1000, 2 * sizeof(float),
              [&](int64_t row, const std::byte*) { order.push_back(row); });
  EXPECT_EQ(order, (std::vector<int64_t>{-3, 0, 7}));  // in row order, the range only
  EXPECT_EQ(store->count(1, 2 * sizeof(float)), 4);
  // A view keeps what it saw.
  auto view = store->view();
  store->erase_table(1);
  EXPECT_EQ(store->count(1, 2 * sizeof(float)), 0);
  EXPECT_EQ(store->count(2, 2 * sizeof(float)), 1);
  int64_t seen = 0;
  store->scan(1, 0, 10, 2 * sizeof(float), [&](int64_t, const std::byte*) { ++seen; }, view.get());
  EXPECT_EQ(seen, 2);
  store->put_meta("table/t", "3 16 f32");
  EXPECT_EQ(store->get_meta("table/t").value_or(""), "3 16 f32");
  EXPECT_FALSE(store->get_meta("table/u").has_value());
  // A row of another width is reported, not misread.
  EXPECT_NE(error_of([&] { store->multi_get(2, {7}, 3 * sizeof(float), nullptr); })
                .find("holds 8 bytes, expected 12"),
            std::string::npos);
}

TEST(KvStore, ReopensKeepingRowsAndScratchStartsEmpty) {
  testing::ScratchDir dir;
  const float v = 2.5f;
  KvStore::open(dir.path() / "db")->put(0, {1}, sizeof v, reinterpret_cast<const std::byte*>(&v));
  EXPECT_EQ(KvStore::open(dir.path() / "db")->count(0, sizeof v), 1);
  EXPECT_EQ(KvStore::open_scratch(dir.path() / "db")->count(0, sizeof v), 0);
}

TEST(KvStore, ErrorsNameThePath) {
  testing::ScratchDir dir;
  std::ofstream(dir.path() / "file") << "x";
  EXPECT_NE(error_of([&] { KvStore::open(dir.path() / "file" / "db"); }).find("cannot create"),
            std::string::npos);
  // A folder with other things in it is never deleted.
  fs::create_directories(dir.path() / "mine");
  std::ofstream(dir.path() / "mine" / "notes.txt") << "keep me";
  EXPECT_NE(error_of([&] { KvStore::open_scratch(dir.path() / "mine"); })
                .find("refusing to delete it"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(dir.path() / "mine" / "notes.txt"));
  // A corrupt database: its MANIFEST overwritten.
  const float v = 1;
  KvStore::open(dir.path() / "db")->put(0, {1}, sizeof v, reinterpret_cast<const std::byte*>(&v));
  for (const auto& e : fs::directory_iterator(dir.path() / "db"))
    if (e.path().filename().string().starts_with("MANIFEST"))
      std::ofstream(e.path(), std::ios::trunc) << "garbage that is not a manifest";
  const std::string message = error_of([&] { KvStore::open(dir.path() / "db"); });
  EXPECT_NE(message.find((dir.path() / "db").string()), std::string::npos) << message;
  EXPECT_NE(message.find("opening the database failed"), std::string::npos) << message;
  // A store another opener holds (RocksDB's LOCK file) says who may hold it.
  const auto held = KvStore::open(dir.path() / "held");
  const std::string locked = error_of([&] { KvStore::open(dir.path() / "held"); });
  EXPECT_NE(locked.find("another process, a trainer or mt_embedding_server, has it open"),
            std::string::npos)
      << locked;
}

TEST(RowCache, LruEvictsTheLeastRecentlyUsed) {
  RowCache cache(4, 8, CachePolicy::LRU, /*ways=*/4);  // one set of 4
  for (int64_t k : {1, 2, 3, 4}) EXPECT_FALSE(cache.insert(k).evicted);
  EXPECT_GE(cache.find(1), 0);  // 2 is now the oldest
  const RowCache::Insert r = cache.insert(5);
  ASSERT_TRUE(r.evicted);
  EXPECT_EQ(r.evicted_key, 2);
  EXPECT_LT(cache.peek(2), 0);
  EXPECT_EQ(cache.size(), 4);
}

TEST(RowCache, LfuEvictsTheLeastOftenUsed) {
  RowCache cache(3, 8, CachePolicy::LFU, /*ways=*/3);
  for (int64_t k : {1, 2, 3}) cache.insert(k);
  for (int i = 0; i < 3; ++i) cache.find(1);
  cache.find(3);
  const RowCache::Insert r = cache.insert(4);  // 2 was used least
  ASSERT_TRUE(r.evicted);
  EXPECT_EQ(r.evicted_key, 2);
  EXPECT_EQ(parse_cache_policy("LFU"), CachePolicy::LFU);
  EXPECT_NE(error_of([] { parse_cache_policy("fifo"); }).find("lru or lfu"), std::string::npos);
}

EmbeddingBagConfig table_config(int64_t rows, int64_t cols, EmbOptimType type) {
  EmbeddingBagConfig c;
  c.name = "t";
  c.num_embeddings = rows;
  c.embedding_dim = cols;
  c.feature_names = {"f"};
  c.optimizer.type = type;
  c.shard = TableShard{10, rows - 10, 0, cols};  // rows [10, rows) of the table
  return c;
}

// KvTable's tests run with the cache's rows in host memory (bytes) and in a tensor (the
// device-memory layout a GPU table uses, here on the CPU): the same results, bitwise.
class KvTableLayouts : public ::testing::TestWithParam<bool> {
 protected:
  KvTableOptions layout(int64_t cache_rows) const {
    KvTableOptions o;
    o.cache_rows = cache_rows;
    o.tensor_cache = GetParam();
    return o;
  }
};

TEST_P(KvTableLayouts, RowsNeverSeenAreTheInMemoryTablesInitialValues) {
  testing::ScratchDir dir;
  const EmbeddingBagConfig c = table_config(50, 4, EmbOptimType::Adam);
  // The in-memory shard, drawn from (seed 5, "emb.t.weight").
  EmbeddingTable memory("EmbeddingBag", c, DType::F32, false);
  nn::InitContext ctx{5, "emb.t."};
  memory.reset_parameters(ctx);
  KvTable kv(KvStore::open_scratch(dir.path() / "db"), 0, c, DType::F32, true, layout(4));
  kv.set_init(ctx);
  const KvWorkingSet ws = kv.gather({0, 3, 39});
  ASSERT_EQ(ws.weight.shape(), (Shape{3, 4}));
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_EQ(floats(ws.weight.narrow(0, i, 1)), floats(memory.weight.narrow(0, ws.rows[i], 1)));
  EXPECT_EQ(ws.momentum1.shape(), (Shape{3, 4}));
  EXPECT_EQ(floats(ws.momentum1), std::vector<float>(12, 0.0f));
  EXPECT_EQ(kv.stats().initialised, 3);
}

TEST_P(KvTableLayouts, WorkingSetsLargerThanTheCachePassThroughTheStore) {
  testing::ScratchDir dir;
  const EmbeddingBagConfig c = table_config(200, 3, EmbOptimType::RowwiseAdagrad);
  KvTable kv(KvStore::open_scratch(dir.path() / "db"), 0, c, DType::F32, true, layout(5));
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < 150; r += 3) rows.push_back(r);
  KvWorkingSet ws = kv.gather(rows);
  // Mark every row: weight = row id, state = -row id.
  for (int64_t i = 0; i < int64_t(rows.size()); ++i) {
    ws.weight.narrow(0, i, 1).fill_(double(rows[size_t(i)]));
    ws.momentum1.narrow(0, i, 1).fill_(-double(rows[size_t(i)]));
  }
  kv.scatter(ws);
  EXPECT_GT(kv.stats().rows_written, 0);  // most rows did not fit
  const KvWorkingSet again = kv.gather(rows);
  for (int64_t i = 0; i < int64_t(rows.size()); ++i) {
    EXPECT_EQ(floats(again.weight.narrow(0, i, 1)), std::vector<float>(3, float(rows[size_t(i)])));
    EXPECT_EQ(floats(again.momentum1.narrow(0, i, 1))[0], -float(rows[size_t(i)]));
  }
  EXPECT_EQ(kv.stats().initialised, int64_t(rows.size()));  // only the first time
  EXPECT_EQ(kv.stats().cache_hits + kv.stats().store_reads, int64_t(rows.size()));
}

TEST_P(KvTableLayouts, PrefetchedRowsWrittenMeanwhileAreReadAgain) {
  testing::ScratchDir dir;
  const EmbeddingBagConfig c = table_config(40, 2, EmbOptimType::SGD);
  KvTable kv(KvStore::open_scratch(dir.path() / "db"), 0, c, DType::F32, true, layout(1));
  KvWorkingSet ws = kv.gather({1, 2});
  ws.weight.fill_(1.0);
  kv.scatter(ws);  // the cache keeps one of them; the other goes to the store
  kv.flush();
  // The next step's rows are read ahead while the current step ({5}) runs.
  kv.gather({5});
  kv.prefetch({1, 2});
  ws = kv.gather({1, 2});
  EXPECT_EQ(floats(ws.weight), std::vector<float>(4, 1.0f));
  EXPECT_EQ(kv.stats().prefetch_hits, 1);  // the other one was cached (and pinned)
  EXPECT_EQ(kv.stats().cache_hits, 1);
  // Rows rewritten in the store after the prefetch read them (here a managed-collision reset)
  // are read again: the prefetch's copies (1.0) are stale.
  kv.scatter(ws);
  kv.gather({7});
  kv.prefetch({1, 2, 3});
  kv.reset_rows({c.shard.row_offset + 1, c.shard.row_offset + 2}, 3);
  const KvWorkingSet next = kv.gather({1, 2, 3});
  EXPECT_NE(floats(next.weight.narrow(0, 0, 1)), std::vector<float>(2, 1.0f));
  EXPECT_NE(floats(next.weight.narrow(0, 1, 1)), std::vector<float>(2, 1.0f));
}

TEST_P(KvTableLayouts, CheckpointReadsAndFieldWrites) {
  testing::ScratchDir dir;
  const EmbeddingBagConfig c = table_config(30, 2, EmbOptimType::RowwiseAdagrad);
  KvTable kv(KvStore::open_scratch(dir.path() / "db"), 0, c, DType::F32, true, layout(2));
  kv.set_init(nn::InitContext{3, "x."});
  KvWorkingSet ws = kv.gather({4, 5, 6});
  ws.weight.fill_(7.0);
  ws.momentum1.fill_(0.5);
  kv.scatter(ws);
  kv.flush();
  EXPECT_EQ(kv.stored_rows(), 3);
  Tensor w = empty({20, 2});
  std::vector<Tensor> st = {empty({20, 1})};
  kv.read_rows(0, 20, w, st, kv.store().view().get());
  EXPECT_EQ(floats(w.narrow(0, 5, 1)), std::vector<float>(2, 7.0f));
  EXPECT_EQ(floats(st[0].narrow(0, 4, 3)), std::vector<float>(3, 0.5f));
  const KvWorkingSet init = kv.gather({0});
  EXPECT_EQ(floats(w.narrow(0, 0, 1)), floats(init.weight));  // untouched: initial values
  kv.write_field(4, 0, full({2, 1}, 9.0));  // rows 4-5's state only
  const KvWorkingSet after = kv.gather({4, 5, 6});
  EXPECT_EQ(floats(after.weight), std::vector<float>(6, 7.0f));
  EXPECT_EQ(floats(after.momentum1), (std::vector<float>{9, 9, 0.5}));
  kv.clear();  // back to the initial values
  EXPECT_EQ(kv.stored_rows(), 0);
  const int64_t initialised = kv.stats().initialised;
  const KvWorkingSet fresh = kv.gather({5});
  EXPECT_EQ(kv.stats().initialised, initialised + 1);
  EXPECT_NE(floats(fresh.weight), std::vector<float>(2, 7.0f));
  EXPECT_EQ(floats(fresh.momentum1), std::vector<float>{0.0f});
}

// A raw-id table keys rows by the ids themselves: any id >= 0, ids below num_embeddings start as
// the in-memory table's rows, the others continue the same keyed stream (row-major, so id r's
// values are the elements [r * dim, (r + 1) * dim) of it).
TEST_P(KvTableLayouts, RawIdTablesTakeAny64BitIdAndStartAsTheMemoryTable) {
  testing::ScratchDir dir;
  EmbeddingBagConfig c = table_config(50, 3, EmbOptimType::RowwiseAdagrad);
  c.shard = TableShard{0, 50, 0, 3};
  EmbeddingTable memory("EmbeddingBag", c, DType::F32, false);
  const nn::InitContext ctx{5, "emb.t."};
  memory.reset_parameters(ctx);
  c.storage = TableStorage::Kv;
  c.raw_ids = true;
  KvTable kv(KvStore::open_scratch(dir.path() / "db"), 0, c, DType::F32, true, layout(2));
  kv.set_init(ctx);
  const int64_t big = (int64_t(1) << 62) + 12345;
  const KvWorkingSet ws = kv.gather({3, 49, 50, 1000000, big});
  EXPECT_EQ(floats(ws.weight.narrow(0, 0, 1)), floats(memory.weight.narrow(0, 3, 1)));
  EXPECT_EQ(floats(ws.weight.narrow(0, 1, 1)), floats(memory.weight.narrow(0, 49, 1)));
  // Past num_embeddings: the same stream, drawn as a bigger table would hold it.
  Tensor wider = empty({2, 3});
  nn::init_uniform_(wider, ctx.key("weight"), -std::sqrt(1.0 / 50), std::sqrt(1.0 / 50), {1000002, 3},
                    {1000000, 0});
  EXPECT_EQ(floats(ws.weight.narrow(0, 3, 1)), floats(wider.narrow(0, 0, 1)));
  for (float v : floats(ws.weight.narrow(0, 4, 1))) EXPECT_LE(std::abs(v), std::sqrt(1.0 / 50));
  // Trained rows go to the store under their ids; read back by id range, in id order.
  KvWorkingSet step = ws;
  step.weight.fill_(2.0);
  step.momentum1.fill_(0.25);
  kv.scatter(step);
  kv.flush();
  EXPECT_EQ(kv.stored_rows(), 5);
  std::vector<int64_t> bounds;
  EXPECT_EQ(kv.stored_bounds(2, bounds, nullptr), 5);
  EXPECT_EQ(bounds, (std::vector<int64_t>{3, 50, big}));  // every 2nd stored id
  const KvStoredRows tail = kv.read_stored(50, std::numeric_limits<int64_t>::max(), nullptr);
  EXPECT_EQ(tail.ids, (std::vector<int64_t>{50, 1000000, big}));
  EXPECT_EQ(floats(tail.weight), std::vector<float>(9, 2.0f));
  EXPECT_EQ(floats(tail.state[0]), std::vector<float>(3, 0.25f));
  // Keyed field writes (a checkpoint load): one field of the given ids, new ids included.
  kv.write_field_ids({big, 7}, 0, full({2, 1}, 4.0));
  const KvWorkingSet after = kv.gather({7, big});
  EXPECT_EQ(floats(after.momentum1), (std::vector<float>{4, 4}));
  EXPECT_EQ(floats(after.weight.narrow(0, 0, 1)), floats(memory.weight.narrow(0, 7, 1)));
  EXPECT_EQ(floats(after.weight.narrow(0, 1, 1)), std::vector<float>(3, 2.0f));
  EXPECT_NE(error_of([&] { kv.gather({-1}); }).find("sorted unique rows"), std::string::npos);
  EXPECT_NE(error_of([&] { kv.reset_rows({1}, 1); }).find("raw-id table"), std::string::npos);
}

// Shards of a raw-id table split the ids by raw_id_owner: every id has exactly one owner, and the
// split is even for consecutive and for strided ids alike.
TEST(KvTable, RawIdOwnersSplitIdsEvenly) {
  for (const int64_t stride : {int64_t(1), int64_t(4), int64_t(1) << 40}) {
    std::vector<int64_t> per(4, 0);
    for (int64_t i = 0; i < 40000; ++i) {
      const int64_t owner = raw_id_owner(i * stride, 4);
      ASSERT_GE(owner, 0);
      ASSERT_LT(owner, 4);
      ++per[size_t(owner)];
    }
    for (int64_t n : per) EXPECT_NEAR(double(n), 10000.0, 400.0) << "stride " << stride;
  }
  testing::ScratchDir dir;
  EmbeddingBagConfig c = table_config(50, 2, EmbOptimType::SGD);
  c.shard = TableShard{0, 25, 0, 2};
  c.storage = TableStorage::Kv;
  c.raw_ids = true;
  KvTableOptions o;
  o.raw_part = 1;
  o.raw_parts = 2;
  KvTable kv(KvStore::open_scratch(dir.path() / "db"), 0, c, DType::F32, false, o);
  for (int64_t id : {int64_t(0), int64_t(17), int64_t(1) << 50})
    EXPECT_EQ(kv.owns(id), raw_id_owner(id, 2) == 1);
  // A raw-id table must be kv-backed.
  EmbeddingBagConfig memory_raw = table_config(50, 2, EmbOptimType::SGD);
  memory_raw.raw_ids = true;
  EXPECT_NE(error_of([&] { EmbeddingBagCollection({memory_raw}); }).find("not kv-backed"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(CacheRows, KvTableLayouts, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "InATensor" : "InHostBytes"; });

}  // namespace
}  // namespace mt::runtime::sparse
