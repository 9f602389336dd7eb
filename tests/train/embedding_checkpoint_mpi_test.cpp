// Checkpoints of sharded embedding tables (train/embedding_checkpoint.h) on real ranks (mpirun -np
// 4 only): a collection trained a few fused steps on 4 ranks (row_wise, table_wise, data_parallel,
// table_row_wise and, in a second test, column_wise tables; row-wise Adagrad, Adam and partial
// row-wise Adam) is saved, then loaded by 2 ranks and by 1 rank (split from the world) under other
// plans: every table's rows and optimizer state, gathered, equal the saved ones exactly, and
// training goes on with the same losses as the uninterrupted 4-rank run over the same global
// batches. Also: the row-wise state of column shards (exact under the same split, the
// width-weighted mean without column shards, refused under another split unless approximated) and a
// table whose num_embeddings changed, refused naming the table and both shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/index.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/embedding/sharded_embedding_bag_collection.h"
#include "parallel/embedding/sharded_managed_collision.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
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

constexpr int64_t kGlobalBatch = 8;  // samples per step, split evenly over 4, 2 or 1 ranks

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(parallel::MpiProcessGroup::world());
  return pg;
}

runtime::TensorOptions f64() { return runtime::TensorOptions{}.with_dtype(DType::F64); }

EmbeddingBagConfig table(std::string name, int64_t rows, int64_t dim, std::string feature,
                         EmbOptimType opt,
                         runtime::PoolingMode pooling = runtime::PoolingMode::Sum) {
  EmbeddingBagConfig c;
  c.name = std::move(name);
  c.num_embeddings = rows;
  c.embedding_dim = dim;
  c.feature_names = {std::move(feature)};
  c.pooling = pooling;
  c.optimizer.type = opt;
  c.optimizer.lr = opt == EmbOptimType::RowwiseAdagrad ? 0.2 : 0.05;
  c.optimizer.eps = 1e-6;
  return c;
}

// Samples [lo, hi) of the global batch of `step`: per feature and sample 0..3 ids drawn from
// (step, sample, feature), so any split of the samples over ranks sees the same data.
KeyedJaggedTensor batch(const std::vector<EmbeddingBagConfig>& tables, int64_t step, int64_t lo,
                        int64_t hi) {
  std::vector<std::string> keys;
  std::vector<int64_t> values, lengths;
  for (size_t t = 0; t < tables.size(); ++t) {
    keys.push_back(tables[t].feature_names[0]);
    for (int64_t b = lo; b < hi; ++b) {
      uint64_t s = testing::mix64(uint64_t(step) * 1000003 + uint64_t(b) * 101 + t);
      const int64_t len = int64_t(s % 4);
      lengths.push_back(len);
      for (int64_t i = 0; i < len; ++i) {
        s = testing::mix64(s);
        values.push_back(int64_t(s % uint64_t(tables[t].num_embeddings)));
      }
    }
  }
  return KeyedJaggedTensor::from_lengths(keys, values, lengths, {}, hi - lo);
}

// One step on this rank's share of the global batch: a nonlinear loss of the pooled output through
// a fixed dense matrix (backward runs the fused updates). Returns the loss summed over the group.
double train_step(ShardedEmbeddingBagCollection& ebc, const std::vector<EmbeddingBagConfig>& tables,
                  int64_t step) {
  ProcessGroup& g = ebc.group();
  const int64_t per = kGlobalBatch / g.size();
  const int64_t lo = per * g.rank();
  int64_t D = 0;
  for (const auto& t : tables) D += t.embedding_dim;
  const Tensor dense = testing::randn64({D, 3}, 500, false, "dense");
  const Tensor pooled = ebc(batch(tables, step, lo, lo + per)).values;
  const Tensor loss = runtime::sum(runtime::square(runtime::tanh(runtime::matmul(pooled, dense))));
  loss.backward();
  Tensor total = runtime::from_vector<double>({loss.item<double>()}, {1}, f64());
  g.all_reduce(total, ReduceOp::Sum, "test.loss");
  return total.item<double>();
}

// Every table's whole weight and optimizer state, gathered over the collection's group (each
// shard counted once): "<table>.weight", "<table>.<field>" (row-wise fields of column_wise tables
// as [rows, column shards]), "<table>.step" (and "<table>.step_min", to check the holders agree).
std::map<std::string, Tensor> gather(const ShardedEmbeddingBagCollection& ebc) {
  ProcessGroup& g = ebc.group();
  const runtime::nn::StateDict state = ebc.optimizer_state_dict();
  const std::vector<parallel::LocalShard> shards = ebc.local_shards();
  std::map<std::string, Tensor> out;
  for (const EmbeddingBagConfig& c : ebc.table_configs()) {
    const parallel::ParameterSharding& p = ebc.plan().at(c.name);
    const parallel::LocalShard* s = nullptr;
    for (const auto& x : shards)
      if (x.table == c.name) s = &x;
    const bool counts = s && (!s->replicated || g.rank() == 0);
    auto place = [&](const std::string& key, const Tensor& whole, const Tensor& local,
                     int64_t col) {
      if (counts) {
        whole.narrow(0, s->placement.row_offset, s->placement.num_rows)
            .narrow(1, col, local.size(1))
            .copy_(local);
      }
      g.all_reduce(whole, ReduceOp::Sum, "test.gather");
      out[c.name + "." + key] = whole;
    };
    place("weight", runtime::zeros({c.num_embeddings, c.embedding_dim}, f64()),
          counts ? s->weight : Tensor(), counts ? s->placement.col_offset : 0);
    for (const std::string field : {"momentum1", "momentum2"}) {
      const std::string key = s ? s->fqn + "." + field : "";
      // Whether the table has this field (the same on every rank: from its optimizer type).
      const EmbOptimType type = c.optimizer.type;
      const bool has = type == EmbOptimType::Adam || type == EmbOptimType::PartialRowwiseAdam ||
                       (type == EmbOptimType::RowwiseAdagrad && field == "momentum1");
      if (!has) continue;
      const bool row_wise = (type == EmbOptimType::RowwiseAdagrad) ||
                            (type == EmbOptimType::PartialRowwiseAdam && field == "momentum2");
      const Tensor local = counts ? state.at(key) : Tensor();
      if (!row_wise) {
        place(field, runtime::zeros({c.num_embeddings, c.embedding_dim}, f64()), local,
              counts ? s->placement.col_offset : 0);
      } else if (p.type == ShardingType::ColumnWise) {
        int64_t k = 0;
        if (counts)
          for (const auto& other : p.shards) k += other.col_offset < s->placement.col_offset;
        place(field, runtime::zeros({c.num_embeddings, int64_t(p.shards.size())}, f64()), local, k);
      } else {
        place(field, runtime::zeros({c.num_embeddings, 1}, f64()), local, 0);
      }
    }
    Tensor hi = runtime::from_vector<double>(
        {s ? double(state.at(s->fqn + ".step").item<int64_t>()) : -1e9}, {1}, f64());
    Tensor lo = runtime::from_vector<double>(
        {s ? double(state.at(s->fqn + ".step").item<int64_t>()) : 1e9}, {1}, f64());
    g.all_reduce(hi, ReduceOp::Max, "test.step_max");
    g.all_reduce(lo, ReduceOp::Min, "test.step_min");
    out[c.name + ".step"] = hi;
    out[c.name + ".step_min"] = lo;
  }
  return out;
}

runtime::sparse::CollectionOptions options() {
  runtime::sparse::CollectionOptions o;
  o.dtype = DType::F64;
  return o;
}

// Loads `dir` into `ebc` (collective over its group).
void load_into(ShardedEmbeddingBagCollection& ebc, const fs::path& dir,
               const EmbeddingLoadOptions& opts = {}) {
  checkpoint::CheckpointState dest;
  const EmbeddingLoadPlan plan =
      embedding_load_template(ebc, checkpoint::read_index(dir / checkpoint::kIndexFileName),
                              "model.", "optimizer.", dest, opts);
  checkpoint::load_checkpoint(dir, dest, ebc.group());
  apply_loaded_embeddings(ebc, plan, dest);
}

void save(const ShardedEmbeddingBagCollection& ebc, const fs::path& dir) {
  checkpoint::CheckpointState state;
  add_embedding_pieces(ebc, "model.", "optimizer.", state);
  checkpoint::save_checkpoint(dir, state, ebc.group());
}

void expect_same(const std::map<std::string, Tensor>& saved,
                 const std::map<std::string, Tensor>& loaded, const std::string& what) {
  ASSERT_EQ(saved.size(), loaded.size()) << what;
  for (const auto& [key, t] : saved) {
    ASSERT_TRUE(loaded.count(key)) << what << ": " << key;
    EXPECT_TRUE(testing::all_close(loaded.at(key), t, 0, 0)) << what << ": " << key;
  }
  for (const auto& [key, t] : loaded) {
    if (key.ends_with(".step")) {
      EXPECT_EQ(t.item<double>(), loaded.at(key + "_min").item<double>())
          << what << ": the holders of " << key << " disagree";
    }
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void guarded(const std::function<void()>& f) { testing::guarded(world()->rank(), f); }

// --- save on 4 (row_wise, table_wise, data_parallel, table_row_wise), load on 2 and 1 with other
// plans ---------

std::vector<EmbeddingBagConfig> mixed_tables() {
  return {table("t_rows", 23, 4, "a", EmbOptimType::RowwiseAdagrad),
          table("t_tab", 13, 6, "b", EmbOptimType::RowwiseAdagrad, runtime::PoolingMode::Mean),
          table("t_adam", 11, 3, "c", EmbOptimType::Adam),
          table("t_dp", 5, 2, "d", EmbOptimType::RowwiseAdagrad),
          table("t_part", 3, 5, "e", EmbOptimType::PartialRowwiseAdam),  // empty row blocks on 4
          table("t_twrw", 17, 3, "f", EmbOptimType::RowwiseAdagrad)};
}

// The (node, local) = (2, 2) mesh of the 4-rank plan's table_row_wise table (collective, once).
std::shared_ptr<parallel::DeviceMesh> node_mesh() {
  static std::shared_ptr<parallel::DeviceMesh> mesh =
      parallel::DeviceMesh::create(world(), {2, 2}, {"node", "local"});
  return mesh;
}

ShardingPlan plan_for(const std::vector<EmbeddingBagConfig>& t, int ranks) {
  ShardingPlan p;
  p.world_size = ranks;
  auto& m = p.tables;
  if (ranks == 4) {
    m["t_rows"] = parallel::row_wise_sharding(t[0], 4);
    m["t_tab"] = parallel::table_wise_sharding(t[1], 1);
    m["t_adam"] = parallel::table_wise_sharding(t[2], 3);
    m["t_dp"] = parallel::data_parallel_sharding(t[3], 4);
    m["t_part"] = parallel::row_wise_sharding(t[4], 4);
    m["t_twrw"] = parallel::table_row_wise_sharding(t[5], 1, 2);  // rows over ranks 2 and 3
    p.local_size = 2;
  } else if (ranks == 2) {
    m["t_rows"] = parallel::table_wise_sharding(t[0], 1);
    m["t_tab"] = parallel::row_wise_sharding(t[1], 2);
    m["t_adam"] = parallel::row_wise_sharding(t[2], 2);
    m["t_dp"] = parallel::table_wise_sharding(t[3], 0);
    m["t_part"] = parallel::data_parallel_sharding(t[4], 2);
    m["t_twrw"] = parallel::row_wise_sharding(t[5], 2);
  } else {
    for (size_t i = 0; i < t.size(); ++i)
      m[t[i].name] = i == 3 ? parallel::data_parallel_sharding(t[i], 1)
                            : parallel::table_wise_sharding(t[i], 0);
  }
  return p;
}

TEST(EmbeddingCheckpoint, SaveOnFourLoadOnTwoAndOneWithOtherPlans) {
  ASSERT_EQ(world()->size(), 4) << "run with mpirun -np 4";
  const int me = world()->rank();
  const auto tables = mixed_tables();
  const fs::path dir = testing::shared_dir(*world(), "mt_ebckpt", "mixed") / "step-3";
  constexpr int kSaved = 3, kMore = 3;

  ShardedEmbeddingBagCollection a(tables, plan_for(tables, 4), world(), node_mesh(), options());
  a.init_weights(7);
  a.train();
  for (int s = 0; s < kSaved; ++s) train_step(a, tables, s);
  const std::map<std::string, Tensor> saved = gather(a);
  save(a, dir);
  std::vector<double> uninterrupted;
  for (int s = kSaved; s < kSaved + kMore; ++s) uninterrupted.push_back(train_step(a, tables, s));

  for (int n : {2, 1}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    std::shared_ptr<ProcessGroup> sub(world()->split(me < n ? 0 : 1, me));
    if (me < n)
      guarded([&] {
        ShardedEmbeddingBagCollection b(tables, plan_for(tables, n), sub, nullptr, options());
        b.init_weights(99);  // other values: everything must come from the checkpoint
        b.train();
        load_into(b, dir);
        expect_same(saved, gather(b), "loaded on " + std::to_string(n) + " ranks");
        for (int s = kSaved; s < kSaved + kMore; ++s) {
          const double loss = train_step(b, tables, s);
          const double ref = uninterrupted[size_t(s - kSaved)];
          EXPECT_NEAR(loss, ref, 1e-10 * (1 + std::abs(ref))) << "step " << s;
        }
      });
    world()->barrier("test.next_load");
  }

  // Weights only (the optimizer state excluded from loading and from applying): the rows come
  // from the checkpoint, the optimizer state stays fresh.
  {
    ShardedEmbeddingBagCollection w(tables, plan_for(tables, 4), world(), node_mesh(), options());
    const auto fresh = gather(w);
    checkpoint::CheckpointState dest;
    EmbeddingLoadPlan plan = embedding_load_template(
        w, checkpoint::read_index(dir / checkpoint::kIndexFileName), "model.", "optimizer.", dest);
    checkpoint::LoadOptions lo;
    lo.exclude = {"optimizer."};
    checkpoint::load_checkpoint(dir, dest, *world(), lo);
    apply_loaded_embeddings(w, plan, dest, lo.exclude);
    for (const auto& [key, t] : gather(w)) {
      const bool weight = key.ends_with(".weight");
      EXPECT_TRUE(testing::all_close(t, (weight ? saved : fresh).at(key), 0, 0)) << key;
    }
  }

  // A table whose size changed: refused on every rank, naming the table and both shapes.
  auto grown = tables;
  grown[0].num_embeddings = 30;
  ShardedEmbeddingBagCollection c(grown, plan_for(grown, 4), world(), node_mesh(), options());
  const std::string msg = error_of([&] { load_into(c, dir); });
  EXPECT_NE(msg.find("t_rows"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[23, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[30, 4]"), std::string::npos) << msg;
  // A table whose optimizer changed (Adam's per-element state into row-wise Adagrad): refused.
  auto other_opt = tables;
  other_opt[2].optimizer.type = EmbOptimType::RowwiseAdagrad;
  ShardedEmbeddingBagCollection d(other_opt, plan_for(other_opt, 4), world(), node_mesh(),
                                  options());
  const std::string msg2 = error_of([&] { load_into(d, dir); });
  EXPECT_NE(msg2.find("t_adam"), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("another optimizer"), std::string::npos) << msg2;
  world()->barrier("test.done");
  if (me == 0) fs::remove_all(dir.parent_path());
}

// --- column_wise: row-wise state per column shard ----------------------------------------------

TEST(EmbeddingCheckpoint, ColumnWiseRowStateReloadsUnderTheSameSplit) {
  ASSERT_EQ(world()->size(), 4) << "run with mpirun -np 4";
  const int me = world()->rank();
  const std::vector<EmbeddingBagConfig> tables = {
      table("t_col", 9, 6, "a", EmbOptimType::RowwiseAdagrad),
      table("t_rows", 7, 3, "b", EmbOptimType::RowwiseAdagrad)};
  const fs::path dir = testing::shared_dir(*world(), "mt_ebckpt", "column") / "step-2";
  ShardingPlan p4;
  p4.world_size = 4;
  p4.tables["t_col"] = parallel::column_wise_sharding(tables[0], {3, 0});  // columns 0-3, 3-6
  p4.tables["t_rows"] = parallel::row_wise_sharding(tables[1], 4);
  ShardedEmbeddingBagCollection a(tables, p4, world(), nullptr, options());
  a.init_weights(5);
  a.train();
  for (int s = 0; s < 2; ++s) train_step(a, tables, s);
  const std::map<std::string, Tensor> saved = gather(a);
  save(a, dir);
  std::vector<double> uninterrupted;
  for (int s = 2; s < 4; ++s) uninterrupted.push_back(train_step(a, tables, s));

  std::shared_ptr<ProcessGroup> two(world()->split(me < 2 ? 0 : 1, me));
  if (me < 2)
    guarded([&] {
      // The same column split on other ranks: exact, and training continues identically.
      ShardingPlan p2;
      p2.world_size = 2;
      p2.tables["t_col"] = parallel::column_wise_sharding(tables[0], {1, 0});
      p2.tables["t_rows"] = parallel::table_wise_sharding(tables[1], 0);
      ShardedEmbeddingBagCollection b(tables, p2, two, nullptr, options());
      b.init_weights(98);
      b.train();
      load_into(b, dir);
      expect_same(saved, gather(b), "same column split on 2 ranks");
      for (int s = 2; s < 4; ++s) {
        const double ref = uninterrupted[size_t(s - 2)];
        EXPECT_NEAR(train_step(b, tables, s), ref, 1e-10 * (1 + std::abs(ref))) << "step " << s;
      }

      // Another column split: refused naming both splits; approximated on request.
      ShardingPlan other = p2;
      parallel::ParameterSharding& cw = other.tables["t_col"];
      cw.shards[0].num_cols = 4;
      cw.shards[1].col_offset = 4;
      cw.shards[1].num_cols = 2;
      ShardedEmbeddingBagCollection c(tables, other, two, nullptr, options());
      const std::string msg = error_of([&] { load_into(c, dir); });
      EXPECT_NE(msg.find("t_col"), std::string::npos) << msg;
      EXPECT_NE(msg.find("0,3,6"), std::string::npos) << msg;
      EXPECT_NE(msg.find("0,4,6"), std::string::npos) << msg;
      load_into(c, dir, EmbeddingLoadOptions{true});
      const auto got = gather(c);
      const Tensor m = saved.at("t_col.momentum1");  // [9, 2], equal widths
      const Tensor mean = runtime::mul(runtime::add(m.narrow(1, 0, 1), m.narrow(1, 1, 1)), 0.5);
      EXPECT_TRUE(testing::all_close(got.at("t_col.momentum1"), runtime::cat({mean, mean}, 1),
                                     1e-15, 1e-15));
      EXPECT_TRUE(testing::all_close(got.at("t_col.weight"), saved.at("t_col.weight"), 0, 0));

      // Whole-row state ([N], t_rows) into column shards: refused, naming the table.
      ShardingPlan to_cols = p2;
      to_cols.tables["t_rows"] = parallel::column_wise_sharding(tables[1], {0, 1});
      ShardedEmbeddingBagCollection d(tables, to_cols, two, nullptr, options());
      const std::string msg2 = error_of([&] { load_into(d, dir); });
      EXPECT_NE(msg2.find("t_rows"), std::string::npos) << msg2;
      EXPECT_NE(msg2.find("column shards"), std::string::npos) << msg2;
    });
  world()->barrier("test.two");

  std::shared_ptr<ProcessGroup> one(world()->split(me == 0 ? 0 : 1, me));
  if (me == 0)
    guarded([&] {
      // No column shards: the row state is the width-weighted mean of the shards' (exact: the
      // whole row's accumulated mean of squared gradients), weights exact.
      ShardingPlan p1;
      p1.world_size = 1;
      p1.tables["t_col"] = parallel::table_wise_sharding(tables[0], 0);
      p1.tables["t_rows"] = parallel::table_wise_sharding(tables[1], 0);
      ShardedEmbeddingBagCollection b(tables, p1, one, nullptr, options());
      b.init_weights(97);
      b.train();
      load_into(b, dir);
      const auto got = gather(b);
      const Tensor m = saved.at("t_col.momentum1");
      const Tensor mean = runtime::mul(runtime::add(m.narrow(1, 0, 1), m.narrow(1, 1, 1)), 0.5);
      EXPECT_TRUE(testing::all_close(got.at("t_col.momentum1"), mean, 1e-15, 1e-15));
      for (const std::string key :
           {"t_col.weight", "t_rows.weight", "t_rows.momentum1", "t_col.step"})
        EXPECT_TRUE(testing::all_close(got.at(key), saved.at(key), 0, 0)) << key;
    });
  world()->barrier("test.done");
  if (me == 0) fs::remove_all(dir.parent_path());
}

// --- managed-collision state ---------------------------------------------------------------------

// Samples [lo, hi) of step `step`'s global batch of raw ids (0..299, so tables fill and evict).
KeyedJaggedTensor raw_ids(int64_t step, int64_t lo, int64_t hi) {
  std::vector<int64_t> values, lengths;
  for (uint64_t f = 0; f < 2; ++f)
    for (int64_t b = lo; b < hi; ++b) {
      uint64_t s = testing::mix64(uint64_t(step) * 7919 + uint64_t(b) * 31 + f);
      const int64_t len = int64_t(s % 4);
      lengths.push_back(len);
      for (int64_t i = 0; i < len; ++i) {
        s = testing::mix64(s);
        values.push_back(int64_t(s % 300));
      }
    }
  return KeyedJaggedTensor::from_lengths({"u", "v"}, values, lengths, {}, hi - lo);
}

void remap_step(parallel::ShardedManagedCollisionCollection& mc, int64_t step) {
  const int64_t per = 3 * kGlobalBatch / mc.group().size();
  mc.remap(raw_ids(step, per * mc.group().rank(), per * (mc.group().rank() + 1)), step);
}

// Every piece's whole global array (f64), gathered over the collection's group.
std::map<std::string, Tensor> gather_mc(const parallel::ShardedManagedCollisionCollection& mc) {
  std::map<std::string, Tensor> out;
  for (const auto& p : mc.state()) {
    Tensor whole = runtime::zeros({p.global_rows}, f64());
    if (p.local.numel() > 0) whole.narrow(0, p.row_offset, p.local.size(0)).copy_(p.local);
    mc.group().all_reduce(whole, ReduceOp::Sum, "test.gather_mc");
    out[p.name] = whole;
  }
  return out;
}

TEST(EmbeddingCheckpoint, ManagedCollisionStateReloadsOnTwoAndOne) {
  ASSERT_EQ(world()->size(), 4) << "run with mpirun -np 4";
  const int me = world()->rank();
  runtime::sparse::ManagedCollisionConfig lru, lfu;
  lru.name = "users";
  lru.num_embeddings = 40;
  lru.num_buckets = 8;
  lru.seed = 3;
  lru.feature_names = {"u"};
  lfu = lru;
  lfu.name = "items";
  lfu.num_embeddings = 16;
  lfu.num_buckets = 4;
  lfu.eviction = runtime::sparse::EvictionPolicy::LFU;
  lfu.feature_names = {"v"};
  const std::vector<runtime::sparse::ManagedCollisionConfig> configs{lru, lfu};
  const fs::path dir = testing::shared_dir(*world(), "mt_ebckpt", "mc") / "step-3";

  parallel::ShardedManagedCollisionCollection a(configs, world());
  for (int s = 0; s < 3; ++s) remap_step(a, s);
  const auto saved = gather_mc(a);
  checkpoint::CheckpointState state;
  add_mc_pieces(a.state(), "model.mc.", state);
  checkpoint::save_checkpoint(dir, state, *world());
  remap_step(a, 3);
  const auto after = gather_mc(a);
  EXPECT_FALSE(testing::all_close(after.at("users.row_ids"), saved.at("users.row_ids"), 0, 0))
      << "step 3 should change the mapping";

  for (int n : {2, 1}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    std::shared_ptr<ProcessGroup> sub(world()->split(me < n ? 0 : 1, me));
    if (me < n)
      guarded([&] {
        parallel::ShardedManagedCollisionCollection b(configs, sub);
        checkpoint::CheckpointState dest;
        const auto pieces = mc_load_pieces(b.state(), "model.mc.", dest);
        checkpoint::load_checkpoint(dir, dest, *sub);
        b.load_state(pieces);
        const auto got = gather_mc(b);
        for (const auto& [name, t] : saved)
          EXPECT_TRUE(testing::all_close(got.at(name), t, 0, 0)) << name;
        remap_step(b, 3);
        const auto next = gather_mc(b);
        for (const auto& [name, t] : after)
          EXPECT_TRUE(testing::all_close(next.at(name), t, 0, 0)) << "after step 3: " << name;
      });
    world()->barrier("test.mc_next");
  }

  // A table of another size: refused naming it.
  auto bigger = configs;
  bigger[0].num_embeddings = 48;
  parallel::ShardedManagedCollisionCollection c(bigger, world());
  checkpoint::CheckpointState dest;
  mc_load_pieces(c.state(), "model.mc.", dest);
  const std::string msg = error_of([&] { checkpoint::load_checkpoint(dir, dest, *world()); });
  EXPECT_NE(msg.find("model.mc.users.row_ids"), std::string::npos) << msg;
  world()->barrier("test.done");
  if (me == 0) fs::remove_all(dir.parent_path());
}

}  // namespace
}  // namespace mt::train
