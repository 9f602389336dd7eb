// ShardedManagedCollisionCollection on real ranks (mpirun -np 2 and 4): over several steps with
// evictions (LRU and LFU tables), a lookup-only feature, duplicate ids, uneven and empty batches
// (one step empty everywhere), each rank's remapped KJT and every table's evicted rows equal the
// single-process ManagedCollisionCollection over the global batch, which every rank runs itself;
// state saved at world W loads on W/2, ... 1 ranks (sub-groups) and continues like the
// uninterrupted single-process run; ShardedEmbeddingBagCollection::reset_rows of the evicted rows
// (row_wise Adagrad and column_wise SGD tables) keeps the sharded tables and their optimizer
// state equal to an unsharded EmbeddingBagCollection trained on the same remapped batches.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "parallel/comm/mpi_process_group.h"
#include "parallel/embedding/sharded_embedding_bag_collection.h"
#include "parallel/embedding/sharded_managed_collision.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "runtime/sparse/embedding_bag_collection.h"
#include "runtime/sparse/managed_collision.h"

namespace mt::parallel {
namespace {

using runtime::DType;
using runtime::Tensor;
using runtime::TensorOptions;
using runtime::sparse::EvictionPolicy;
using runtime::sparse::KeyedJaggedTensor;
using runtime::sparse::ManagedCollisionCollection;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(MpiProcessGroup::world());
  return pg;
}

std::vector<ManagedCollisionConfig> mc_tables() {
  ManagedCollisionConfig users;
  users.name = "t_user";
  users.num_embeddings = 24;
  users.num_buckets = 8;
  users.seed = 3;
  users.eviction = EvictionPolicy::LRU;
  users.feature_names = {"user", "user_hist"};
  ManagedCollisionConfig items;
  items.name = "t_item";
  items.num_embeddings = 10;
  items.num_buckets = 5;
  items.seed = 4;
  items.eviction = EvictionPolicy::LFU;
  items.feature_names = {"item"};
  return {users, items};
}

// A batch as host vectors: keys in another order than the tables, plus a pass-through key.
struct Batch {
  int64_t B = 0;
  std::vector<std::vector<int64_t>> lengths, values;  // per key
};
const std::vector<std::string> kKeys = {"item", "other", "user", "user_hist"};

// Rank r's batch of `step` in a world of W: batch sizes 0, 1 or 2 (0 everywhere at step 4).
Batch local_batch(int step, int W, int r) {
  std::mt19937_64 gen(uint64_t(step * 1000 + W * 10 + r));
  Batch b;
  b.B = step == 4 ? 0 : (step + r) % 3;
  const int64_t id_range[] = {30, 1000, 70, 70};
  b.lengths.resize(kKeys.size());
  b.values.resize(kKeys.size());
  for (size_t k = 0; k < kKeys.size(); ++k)
    for (int64_t s = 0; s < b.B; ++s) {
      const int64_t n = int64_t(gen() % 4);
      b.lengths[k].push_back(n);
      for (int64_t i = 0; i < n; ++i) b.values[k].push_back(int64_t(gen() % id_range[k]));
    }
  return b;
}

KeyedJaggedTensor to_kjt(const Batch& b) {
  std::vector<int64_t> lengths, values;
  for (size_t k = 0; k < kKeys.size(); ++k) {
    lengths.insert(lengths.end(), b.lengths[k].begin(), b.lengths[k].end());
    values.insert(values.end(), b.values[k].begin(), b.values[k].end());
  }
  return KeyedJaggedTensor::from_lengths(kKeys, values, lengths, {}, b.B);
}

// The global batch: the ranks' batches in rank order, key by key.
Batch global_batch(int step, int W) {
  Batch g;
  g.lengths.resize(kKeys.size());
  g.values.resize(kKeys.size());
  for (int r = 0; r < W; ++r) {
    const Batch b = local_batch(step, W, r);
    g.B += b.B;
    for (size_t k = 0; k < kKeys.size(); ++k) {
      g.lengths[k].insert(g.lengths[k].end(), b.lengths[k].begin(), b.lengths[k].end());
      g.values[k].insert(g.values[k].end(), b.values[k].begin(), b.values[k].end());
    }
  }
  return g;
}

// Samples [s0, s0 + B) of a KJT, per key: (lengths, values).
std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> samples(
    const KeyedJaggedTensor& kjt, int64_t s0, int64_t B) {
  const std::vector<int64_t> len = kjt.lengths().to_vector<int64_t>();
  const std::vector<int64_t> off = kjt.offsets().to_vector<int64_t>();
  const std::vector<int64_t> val = kjt.values().to_vector<int64_t>();
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> out;
  for (int64_t k = 0; k < kjt.num_keys(); ++k) {
    const int64_t b0 = k * kjt.stride() + s0;
    out.emplace_back(
        std::vector<int64_t>(len.begin() + b0, len.begin() + b0 + B),
        std::vector<int64_t>(val.begin() + off[size_t(b0)], val.begin() + off[size_t(b0 + B)]));
  }
  return out;
}

// This rank's first sample in the global batch of a group of W ranks.
int64_t first_sample(int step, int W, int r) {
  int64_t s = 0;
  for (int q = 0; q < r; ++q) s += local_batch(step, W, q).B;
  return s;
}

// One step on both; checks the rank's part of the output and the evictions. Returns the
// sharded result.
McCollectionResult step_and_compare(ShardedManagedCollisionCollection& sharded,
                                    ManagedCollisionCollection& ref, int step,
                                    McCollectionResult* ref_out = nullptr) {
  const int W = sharded.group().size(), r = sharded.group().rank();
  const Batch mine = local_batch(step, W, r);
  McCollectionResult got = sharded.remap(to_kjt(mine), step);
  McCollectionResult want = ref.remap(to_kjt(global_batch(step, W)), step);
  EXPECT_EQ(got.features.keys(), kKeys);
  EXPECT_EQ(got.features.stride(), mine.B);
  const auto g = samples(got.features, 0, mine.B);
  const auto w = samples(want.features, first_sample(step, W, r), mine.B);
  for (size_t k = 0; k < kKeys.size(); ++k) {
    EXPECT_EQ(g[k].first, w[k].first) << "lengths of " << kKeys[k] << ", step " << step;
    EXPECT_EQ(g[k].second, w[k].second) << "values of " << kKeys[k] << ", step " << step;
  }
  EXPECT_EQ(got.evicted.size(), want.evicted.size());
  for (size_t t = 0; t < got.evicted.size() && t < want.evicted.size(); ++t) {
    EXPECT_EQ(got.evicted[t].table, want.evicted[t].table);
    EXPECT_EQ(got.evicted[t].rows, want.evicted[t].rows) << "evicted rows, step " << step;
  }
  if (ref_out) *ref_out = std::move(want);
  return got;
}

// The group's state as one piece per rank and array (the layout a checkpoint saved at this
// world size holds): every rank gets every piece (all-reduce of the global arrays).
std::vector<McStatePiece> gathered_state(ShardedManagedCollisionCollection& mc) {
  ProcessGroup& g = mc.group();
  std::vector<McStatePiece> out;
  const std::vector<McStatePiece> mine = mc.state();
  for (size_t t = 0; t < mc.num_tables(); ++t) {
    const auto& table = mc.local_table(t);
    const int64_t N = table.num_embeddings();
    for (int a = 0; a < 2; ++a) {  // row_ids, row_meta
      const McStatePiece& p = mine[2 * t + size_t(a)];
      Tensor global = runtime::zeros({N}, TensorOptions{}.with_dtype(DType::I64));
      const std::vector<int64_t> v = p.local.to_vector<int64_t>();
      for (size_t i = 0; i < v.size(); ++i)
        global.data<int64_t>()[p.row_offset + int64_t(i)] = v[i] + (a == 0 ? 1 : 0);  // -1 -> 0
      g.all_reduce(global, ReduceOp::Sum, "test_state");
      if (a == 0)
        for (int64_t i = 0; i < N; ++i) global.data<int64_t>()[i] -= 1;
      for (int r = 0; r < g.size(); ++r) {
        const auto [b0, b1] = mc.bucket_range(t, r);
        const int64_t lo = table.bucket_row_begin(b0), hi = table.bucket_row_begin(b1);
        out.push_back({p.name, global.narrow(0, lo, hi - lo).contiguous(), N, lo});
      }
    }
  }
  return out;
}

void expect_same_state(const std::vector<McStatePiece>& gathered,
                       const ManagedCollisionCollection& ref) {
  for (const McStatePiece& want : ref.state()) {
    std::vector<int64_t> got(size_t(want.global_rows), -7);
    for (const McStatePiece& p : gathered) {
      if (p.name != want.name) continue;
      const std::vector<int64_t> v = p.local.to_vector<int64_t>();
      std::copy(v.begin(), v.end(), got.begin() + p.row_offset);
    }
    EXPECT_EQ(got, want.local.to_vector<int64_t>()) << want.name;
  }
}

TEST(ShardedManagedCollision, MatchesSingleProcess) {
  ShardedManagedCollisionCollection sharded(mc_tables(), world());
  ManagedCollisionCollection ref(mc_tables());
  sharded.set_lookup_only("user_hist");
  ref.set_lookup_only("user_hist");
  int64_t evicted = 0;
  for (int step = 0; step < 9; ++step) {
    const McCollectionResult r = step_and_compare(sharded, ref, step);
    for (const auto& e : r.evicted) evicted += int64_t(e.rows.size());
  }
  EXPECT_GT(evicted, 0) << "the test should exercise evictions";
  const McStats g = sharded.global_stats(), want = ref.stats();
  EXPECT_EQ(g.hits, want.hits);
  EXPECT_EQ(g.inserts, want.inserts);
  EXPECT_EQ(g.evictions, want.evictions);
  EXPECT_EQ(g.misses, want.misses);
  EXPECT_EQ(g.overflow, want.overflow);
  EXPECT_GT(want.misses, 0);
  expect_same_state(gathered_state(sharded), ref);
}

// Save at W, load at W/2 (each half of the ranks is its own group running the same program),
// and so on down to 1 rank; every stage continues like the uninterrupted single-process run.
TEST(ShardedManagedCollision, StateReshardsAcrossWorldSizes) {
  ManagedCollisionCollection ref(mc_tables());
  ref.set_lookup_only("user_hist");
  std::shared_ptr<ProcessGroup> group = world();
  auto mc = std::make_unique<ShardedManagedCollisionCollection>(mc_tables(), group);
  mc->set_lookup_only("user_hist");
  int step = 0;
  for (; step < 3; ++step) step_and_compare(*mc, ref, step);
  while (group->size() > 1) {
    const std::vector<McStatePiece> saved = gathered_state(*mc);
    const int half = group->size() / 2;
    std::shared_ptr<ProcessGroup> sub(group->split(group->rank() / half, group->rank()));
    ASSERT_EQ(sub->size(), half);
    auto next = std::make_unique<ShardedManagedCollisionCollection>(mc_tables(), sub);
    next->set_lookup_only("user_hist");
    // Each rank passes every saved piece; it takes the rows of its own buckets.
    next->load_state(saved);
    expect_same_state(gathered_state(*next), ref);
    for (int k = 0; k < 3; ++k, ++step) step_and_compare(*next, ref, step);
    mc = std::move(next);
    group = sub;
  }
  EXPECT_GT(ref.stats().evictions, 0);
}

std::vector<EmbeddingBagConfig> ebc_tables() {
  EmbeddingBagConfig users;
  users.name = "t_user";
  users.num_embeddings = 24;
  users.embedding_dim = 4;
  users.feature_names = {"user", "user_hist"};
  users.optimizer.type = runtime::sparse::EmbOptimType::RowwiseAdagrad;
  users.optimizer.lr = 0.2;
  EmbeddingBagConfig items;
  items.name = "t_item";
  items.num_embeddings = 10;
  items.embedding_dim = 5;
  items.feature_names = {"item"};
  items.optimizer.type = runtime::sparse::EmbOptimType::SGD;
  items.optimizer.lr = 0.1;
  return {users, items};
}

TEST(ShardedManagedCollision, ResetRowsMatchesUnsharded) {
  const int W = world()->size();
  const std::vector<EmbeddingBagConfig> tables = ebc_tables();
  ShardingPlan plan;
  plan.world_size = W;
  plan.tables["t_user"] = row_wise_sharding(tables[0], W);
  plan.tables["t_item"] = column_wise_sharding(tables[1], {W - 1, 0});
  runtime::sparse::CollectionOptions options;
  options.dtype = DType::F64;
  ShardedEmbeddingBagCollection sebc(tables, plan, world(), nullptr, options);
  runtime::sparse::EmbeddingBagCollection ebc(tables, options);
  sebc.init_weights(11);
  ebc.init_weights(11);
  ShardedManagedCollisionCollection sharded(mc_tables(), world());
  ManagedCollisionCollection ref(mc_tables());
  int64_t resets = 0;
  for (int step = 0; step < 8; ++step) {
    McCollectionResult want;
    const McCollectionResult got = step_and_compare(sharded, ref, step, &want);
    for (const auto& e : got.evicted) sebc.reset_rows(e.table, e.rows, step);
    for (const auto& e : want.evicted) {
      ebc.reset_rows(e.table, e.rows, step);
      resets += int64_t(e.rows.size());
    }
    runtime::sum(sebc(got.features).values).backward();
    runtime::sum(ebc(want.features).values).backward();
  }
  EXPECT_GT(resets, 0);
  const runtime::nn::StateDict sstate = sebc.optimizer_state_dict();
  const runtime::nn::StateDict ustate = ebc.optimizer_state_dict();
  const std::vector<Tensor> uweights = ebc.weights();
  for (const LocalShard& s : sebc.local_shards()) {
    const size_t t = s.table == "t_user" ? 0 : 1;
    const Tensor want = uweights[t]
                            .narrow(0, s.placement.row_offset, s.placement.num_rows)
                            .narrow(1, s.placement.col_offset, s.placement.num_cols)
                            .contiguous();
    const std::vector<double> a = s.weight.contiguous().to_vector<double>();
    const std::vector<double> b = want.to_vector<double>();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-12) << s.fqn << " " << i;
    const std::string key = s.fqn + ".momentum1";
    if (!ustate.contains(key)) continue;  // SGD: no state
    const std::vector<double> ma = sstate.at(key).contiguous().to_vector<double>();
    const std::vector<double> mb = ustate.at(key)
                                       .narrow(0, s.placement.row_offset, s.placement.num_rows)
                                       .contiguous()
                                       .to_vector<double>();
    ASSERT_EQ(ma.size(), mb.size());
    for (size_t i = 0; i < ma.size(); ++i) EXPECT_NEAR(ma[i], mb[i], 1e-12) << key << " " << i;
  }
}

}  // namespace
}  // namespace mt::parallel
