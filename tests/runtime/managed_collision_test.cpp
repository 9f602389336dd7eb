// ManagedCollisionTable / ManagedCollisionCollection (runtime/sparse/managed_collision.h): rows
// kept once assigned, LRU and LFU eviction on hand-made sequences with known results, lookup-only
// misses, duplicates in a batch, a bucket overflowing within one batch, state round trips and
// rebuilds from row ranges; and EmbeddingBagCollection::reset_rows (rows redrawn, optimizer
// state zeroed, other rows untouched).
#include "runtime/sparse/managed_collision.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "runtime/sparse/embedding_bag_collection.h"

namespace mt::runtime::sparse {
namespace {

using Rows = std::vector<int64_t>;

ManagedCollisionConfig one_bucket(int64_t rows, EvictionPolicy policy) {
  ManagedCollisionConfig c;
  c.name = "t";
  c.num_embeddings = rows;
  c.num_buckets = 1;
  c.eviction = policy;
  return c;
}

TEST(ManagedCollision, LruEvictionOrder) {
  ManagedCollisionTable t(one_bucket(3, EvictionPolicy::LRU));
  McRemapResult r = t.remap({10, 20}, true, 0);
  EXPECT_EQ(r.rows, (Rows{0, 1}));  // lowest free rows first
  EXPECT_TRUE(r.evicted.empty());
  EXPECT_EQ(t.remap({30}, true, 1).rows, (Rows{2}));
  EXPECT_EQ(t.remap({10}, true, 2).rows, (Rows{0}));  // kept; last used: 0@2, 20@0, 30@1
  r = t.remap({40}, true, 3);                         // evicts 20 (least recent)
  EXPECT_EQ(r.rows, (Rows{1}));
  EXPECT_EQ(r.evicted, (Rows{1}));
  EXPECT_EQ(t.find(20), -1);
  r = t.remap({50, 10}, true, 4);  // 10 is a hit first; 50 evicts 30 (row 2, used at 1)
  EXPECT_EQ(r.rows, (Rows{2, 0}));
  EXPECT_EQ(r.evicted, (Rows{2}));
  // last used: row0 (10) 4, row1 (40) 3, row2 (50) 4. 60 evicts row 1; 70 the tie 0 vs 2 -> 0;
  // 80 takes row 2; the second 60 is the same row.
  r = t.remap({60, 70, 80, 60}, true, 5);
  EXPECT_EQ(r.rows, (Rows{1, 0, 2, 1}));
  EXPECT_EQ(r.evicted, (Rows{0, 1, 2}));
  // Every row is used by this batch: the new id 90 is dropped, nobody is evicted.
  r = t.remap({90, 60, 70, 80}, true, 6);
  EXPECT_EQ(r.rows, (Rows{-1, 1, 0, 2}));
  EXPECT_TRUE(r.evicted.empty());
  EXPECT_EQ(t.stats().overflow, 1);
  EXPECT_EQ(t.stats().inserts, 8);
  EXPECT_EQ(t.stats().evictions, 5);
  EXPECT_EQ(t.stats().hits, 5);
}

TEST(ManagedCollision, LfuEvictionOrder) {
  ManagedCollisionTable t(one_bucket(3, EvictionPolicy::LFU));
  EXPECT_EQ(t.remap({10, 10, 10, 20, 30}, true, 0).rows, (Rows{0, 0, 0, 1, 2}));  // counts 3 1 1
  EXPECT_EQ(t.remap({20}, true, 1).rows, (Rows{1}));                              // 3 2 1
  McRemapResult r = t.remap({40}, true, 2);  // evicts 30 (count 1)
  EXPECT_EQ(r.rows, (Rows{2}));
  EXPECT_EQ(r.evicted, (Rows{2}));
  r = t.remap({50}, true, 3);  // 40 has count 1: evicted again
  EXPECT_EQ(r.rows, (Rows{2}));
  EXPECT_EQ(r.evicted, (Rows{2}));
  r = t.remap({50, 50, 60}, true, 4);  // 50 -> count 3; 60 evicts 20 (count 2, not 10's 3)
  EXPECT_EQ(r.rows, (Rows{2, 2, 1}));
  EXPECT_EQ(r.evicted, (Rows{1}));
  const auto st = t.state();
  EXPECT_EQ(st[0].local.to_vector<int64_t>(), (Rows{10, 60, 50}));
  EXPECT_EQ(st[1].local.to_vector<int64_t>(), (Rows{3, 1, 3}));
}

TEST(ManagedCollision, LookupOnlyMissesAndDuplicates) {
  ManagedCollisionTable t(one_bucket(4, EvictionPolicy::LRU));
  EXPECT_EQ(t.remap({1, 2, 1, 1}, true, 0).rows, (Rows{0, 1, 0, 0}));  // one row per id
  EXPECT_EQ(t.stats().inserts, 2);
  McRemapResult r = t.remap({2, 3}, false, 1);
  EXPECT_EQ(r.rows, (Rows{1, -1}));
  EXPECT_EQ(t.stats().misses, 1);
  EXPECT_EQ(t.find(3), -1);  // not inserted
  EXPECT_EQ(t.remap({3}, true, 2).rows, (Rows{2}));
  // A lookup-only occurrence finds the row an inserting one gives the id in the same batch.
  EXPECT_EQ(t.remap({5, 5}, std::vector<uint8_t>{0, 1}, 3).rows, (Rows{3, 3}));
  EXPECT_EQ(t.stats().misses, 1);
  EXPECT_THROW(t.remap({-4}, true, 4), Error);
}

// A remap does not depend on the order of the batch's ids (what lets the sharded version agree
// with one process however the ranks split the batch): the same rows per id, the same
// evictions, the same overflow, for a batch and its reversal, over several steps with a full
// table.
TEST(ManagedCollision, RemapIgnoresTheOrderOfTheIds) {
  for (EvictionPolicy policy : {EvictionPolicy::LRU, EvictionPolicy::LFU}) {
    ManagedCollisionConfig c;
    c.name = "t";
    c.num_embeddings = 12;
    c.num_buckets = 3;
    c.eviction = policy;
    ManagedCollisionTable forward(c), backward(c);
    std::mt19937_64 gen(9);
    for (int64_t step = 0; step < 6; ++step) {
      std::vector<int64_t> ids(10);
      for (int64_t& id : ids) id = int64_t(gen() % 40);
      std::vector<int64_t> reversed(ids.rbegin(), ids.rend());
      const McRemapResult a = forward.remap(ids, true, step);
      McRemapResult b = backward.remap(reversed, true, step);
      std::reverse(b.rows.begin(), b.rows.end());
      EXPECT_EQ(a.rows, b.rows) << "step " << step;
      EXPECT_EQ(a.evicted, b.evicted) << "step " << step;
    }
    EXPECT_GT(forward.stats().evictions, 0);
    EXPECT_EQ(forward.stats().evictions, backward.stats().evictions);
    EXPECT_EQ(forward.stats().overflow, backward.stats().overflow);
  }
}

// Many buckets: ids stay in their bucket's rows, keep their rows until evicted, distinct ids of
// a batch get distinct rows.
TEST(ManagedCollision, BucketsAndStableRows) {
  ManagedCollisionConfig c;
  c.name = "t";
  c.num_embeddings = 100;
  c.num_buckets = 7;
  c.seed = 5;
  ManagedCollisionTable t(c);
  std::mt19937_64 gen(3);
  std::map<int64_t, int64_t> known;  // id -> row
  for (int step = 0; step < 30; ++step) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 25; ++i) ids.push_back(int64_t(gen() % 300));
    McRemapResult r = t.remap(ids, true, step);
    for (int64_t row : r.evicted)
      for (auto it = known.begin(); it != known.end();)
        it = it->second == row ? known.erase(it) : std::next(it);
    std::map<int64_t, int64_t> batch;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (r.rows[i] < 0) continue;
      const int64_t b = t.bucket_of(ids[i]);
      EXPECT_GE(r.rows[i], t.bucket_row_begin(b));
      EXPECT_LT(r.rows[i], t.bucket_row_begin(b + 1));
      auto k = known.find(ids[i]);
      if (k != known.end()) {
        EXPECT_EQ(k->second, r.rows[i]) << "id " << ids[i];
      }
      EXPECT_EQ(batch.emplace(ids[i], r.rows[i]).first->second, r.rows[i]);
    }
    std::set<int64_t> distinct;
    for (auto& [id, row] : batch) {
      EXPECT_TRUE(distinct.insert(row).second) << "row " << row << " given to two ids";
      known[id] = row;
    }
  }
  EXPECT_GT(t.stats().evictions, 0);
  EXPECT_EQ(t.num_assigned(), 100);
}

TEST(ManagedCollision, StateRoundTripAndRangeRebuild) {
  for (EvictionPolicy policy : {EvictionPolicy::LRU, EvictionPolicy::LFU}) {
    ManagedCollisionConfig c;
    c.name = "users";
    c.num_embeddings = 40;
    c.num_buckets = 8;
    c.eviction = policy;
    ManagedCollisionTable a(c);
    std::mt19937_64 gen(11);
    auto batch = [&]() {
      std::vector<int64_t> ids;
      for (int i = 0; i < 12; ++i) ids.push_back(int64_t(gen() % 90));
      return ids;
    };
    for (int step = 0; step < 8; ++step) a.remap(batch(), true, step);
    const std::vector<McStatePiece> saved = a.state();
    ASSERT_EQ(saved.size(), 2u);
    EXPECT_EQ(saved[0].name, "users.row_ids");
    EXPECT_EQ(saved[0].global_rows, 40);

    // Full round trip: continues exactly as the original.
    ManagedCollisionTable b(c);
    b.load_state(saved);
    // Pieces cut at rows that split buckets (12, 27): still rebuilt fully after load_state.
    ManagedCollisionTable d(c);
    std::vector<McStatePiece> cut;
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, 12}, {12, 27}, {27, 40}})
      for (const McStatePiece& p : saved)
        cut.push_back({p.name, p.local.narrow(0, lo, hi - lo).contiguous(), 40, lo});
    d.load_state(cut);
    // A table owning buckets [2, 5) (rows [10, 25)) loads the whole state.
    ManagedCollisionTable part(c, 2, 5);
    EXPECT_EQ(part.row_begin(), 10);
    EXPECT_EQ(part.row_end(), 25);
    part.load_state(saved);
    for (int64_t id = 0; id < 90; ++id) {
      const int64_t b = a.bucket_of(id);
      if (b >= 2 && b < 5) {
        EXPECT_EQ(part.find(id), a.find(id)) << "id " << id;
      }
    }
    // load_rows of a range rebuilds the buckets fully inside it.
    ManagedCollisionTable e(c);
    e.load_rows(10, saved[0].local.narrow(0, 10, 15).contiguous(),
                saved[1].local.narrow(0, 10, 15).contiguous());
    for (int64_t id = 0; id < 90; ++id) {
      const int64_t b = a.bucket_of(id);
      if (b >= 2 && b < 5) {
        EXPECT_EQ(e.find(id), a.find(id)) << "id " << id;
      }
    }
    // A range splitting a bucket (rows [12, 27): bucket 2 is [10, 15)) leaves it unusable.
    ManagedCollisionTable split(c);
    split.load_rows(12, cut[2].local, cut[3].local);
    const std::vector<int64_t> saved_ids = saved[0].local.to_vector<int64_t>();
    for (int64_t row = 15; row < 25; ++row)  // buckets 3 and 4 are rebuilt
      if (saved_ids[size_t(row)] >= 0) {
        EXPECT_EQ(split.find(saved_ids[size_t(row)]), row);
      }
    try {
      split.remap({1}, true, 0);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("bucket 2 (rows [10, 15)) was only partly loaded"),
                std::string::npos)
          << err.what();
    }
    for (int step = 8; step < 16; ++step) {
      const std::vector<int64_t> ids = batch();
      const McRemapResult ra = a.remap(ids, true, step);
      const McRemapResult rb = b.remap(ids, true, step);
      const McRemapResult rd = d.remap(ids, true, step);
      EXPECT_EQ(ra.rows, rb.rows);
      EXPECT_EQ(ra.evicted, rb.evicted);
      EXPECT_EQ(ra.rows, rd.rows);
      EXPECT_EQ(ra.evicted, rd.evicted);
    }
    // Missing rows, a wrong seed, and a wrong size are refused with messages.
    ManagedCollisionTable f(c);
    std::vector<McStatePiece> half;
    for (const McStatePiece& p : saved)
      half.push_back({p.name, p.local.narrow(0, 0, 20).contiguous(), 40, 0});
    try {
      f.load_state(half);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("does not cover rows [20, 40)"), std::string::npos)
          << err.what();
    }
    ManagedCollisionConfig other = c;
    other.seed = 99;
    ManagedCollisionTable g(other);
    try {
      g.load_state(saved);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("another seed or num_buckets"), std::string::npos)
          << err.what();
    }
    other = c;
    other.num_embeddings = 41;
    ManagedCollisionTable h(other);
    EXPECT_THROW(h.load_state(saved), Error);
  }
}

TEST(ManagedCollision, CollectionRemapsKjt) {
  ManagedCollisionConfig users = one_bucket(3, EvictionPolicy::LRU);
  users.name = "t_user";
  users.feature_names = {"user", "user_hist"};
  ManagedCollisionConfig items = one_bucket(2, EvictionPolicy::LFU);
  items.name = "t_item";
  items.feature_names = {"item"};
  ManagedCollisionCollection mc({users, items});
  mc.set_lookup_only("user_hist");
  EXPECT_TRUE(mc.lookup_only("user_hist"));
  EXPECT_THROW(mc.set_lookup_only("nope"), Error);
  // Keys in another order than the tables, an extra pass-through key "other" (negative ids kept).
  // B = 2. item: [7], [7, 8, 9]; other: [-1], []; user_hist: [100], [5]; user: [5, 6], [].
  const auto kjt = KeyedJaggedTensor::from_lengths(
      {"item", "other", "user_hist", "user"}, {7, 7, 8, 9, -1, 100, 5, 5, 6},
      {1, 3, 1, 0, 1, 1, 2, 0}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  McCollectionResult r = mc.remap(kjt, 0);
  // t_user batch: user (5, 6) then user_hist (100 unknown: dropped; 5 found).
  // t_item batch: 7, 7, 8 -> rows 0, 0, 1; 9: both rows used by this batch: dropped.
  EXPECT_EQ(r.features.keys(), kjt.keys());
  EXPECT_EQ(r.features.values().to_vector<int64_t>(), (Rows{0, 0, 1, -1, 0, 0, 1}));
  EXPECT_EQ(r.features.lengths().to_vector<int64_t>(), (Rows{1, 2, 1, 0, 0, 1, 2, 0}));
  EXPECT_EQ(r.features.weights().to_vector<float>(), (std::vector<float>{1, 2, 3, 5, 7, 8, 9}));
  ASSERT_EQ(r.evicted.size(), 2u);
  EXPECT_EQ(r.evicted[0].table, "t_user");
  const McStats s = mc.stats();
  EXPECT_EQ(s.inserts, 4);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.overflow, 1);
  EXPECT_EQ(s.hits, 0);
  // Next step: user 5 is a hit, 11 takes the free row 2 (free rows before evictions); item 9
  // evicts the LFU item 8 (count 1 < 7's 2) at row 1.
  const auto kjt2 = KeyedJaggedTensor::from_lengths({"user", "user_hist", "item", "other"},
                                                    {5, 11, 9}, {2, 0, 1, 0});
  r = mc.remap(kjt2, 1);
  EXPECT_EQ(r.features.values().to_vector<int64_t>(), (Rows{0, 2, 1}));
  EXPECT_TRUE(r.evicted[0].rows.empty());
  EXPECT_EQ(r.evicted[1].rows, (Rows{1}));
  // A missing feature is named.
  const auto bad = KeyedJaggedTensor::from_lengths({"user", "item"}, {1}, {1, 0});
  EXPECT_THROW(mc.remap(bad, 2), Error);
}

// reset_rows: the rows are redrawn (the same draw for a sharded table), others untouched, the
// fused optimizer's state of those rows zeroed.
TEST(ManagedCollision, EmbeddingBagResetRows) {
  EmbeddingBagConfig c;
  c.name = "t";
  c.num_embeddings = 6;
  c.embedding_dim = 4;
  c.feature_names = {"f"};
  c.optimizer.type = EmbOptimType::RowwiseAdagrad;
  c.optimizer.lr = 0.5;
  EmbeddingBagCollection ebc({c});
  ebc.init_weights(7);
  ebc.train();
  const auto kjt = KeyedJaggedTensor::from_lengths({"f"}, {0, 1, 2, 3, 4, 5}, {3, 3});
  runtime::sum(ebc(kjt).values).backward();  // fused step: every row and its state change
  const Tensor before = ebc.weights()[0].clone();
  ebc.reset_rows("t", {1, 4}, 3);
  const Tensor after = ebc.weights()[0].clone();
  const auto state = ebc.fused_optimizer().table_state(0);
  ASSERT_EQ(state.size(), 1u);
  const std::vector<float> m = state[0].second.to_vector<float>();
  for (int64_t r = 0; r < 6; ++r) {
    const bool reset = r == 1 || r == 4;
    EXPECT_EQ(m[size_t(r)] == 0.0f, reset) << "row " << r;
    const auto a = after.narrow(0, r, 1).contiguous().to_vector<float>();
    const auto b = before.narrow(0, r, 1).contiguous().to_vector<float>();
    EXPECT_EQ(a == b, !reset) << "row " << r;
    for (float v : a) EXPECT_LE(std::abs(v), std::sqrt(1.0f / 6) + 0.5f);
  }
  // A row shard of the same table (rows [3, 6)) draws the same values for row 4.
  EmbeddingBagConfig shard = c;
  shard.shard.row_offset = 3;
  shard.shard.num_rows = 3;
  EmbeddingBagCollection part({shard});
  part.init_weights(7);
  part.reset_rows("t", {1, 4}, 3);
  EXPECT_EQ(part.weights()[0].narrow(0, 1, 1).contiguous().to_vector<float>(),
            after.narrow(0, 4, 1).contiguous().to_vector<float>());
  // Another step draws other values; an unknown table is named.
  ebc.reset_rows("t", {4}, 4);
  EXPECT_NE(ebc.weights()[0].narrow(0, 4, 1).contiguous().to_vector<float>(),
            after.narrow(0, 4, 1).contiguous().to_vector<float>());
  EXPECT_THROW(ebc.reset_rows("nope", {1}, 0), Error);
  EXPECT_THROW(ebc.reset_rows("t", {6}, 0), Error);
}

}  // namespace
}  // namespace mt::runtime::sparse
