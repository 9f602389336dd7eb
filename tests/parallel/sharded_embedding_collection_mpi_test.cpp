// ShardedEmbeddingCollection (unpooled) on real ranks (mpirun -np 2, 3 and 4): for every sharding
// type and a mixed plan, the per-id rows, the row-sparse gradients and the rows and fused optimizer
// state (row-wise Adagrad, Adam) after fused steps equal an unsharded single-process
// EmbeddingCollection over the global batch, which every rank builds itself from the same seed.
// The batches have an empty feature, a rank with an empty batch, uneven batch sizes, duplicate
// ids, and row blocks that are empty on some ranks.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/mpi_process_group.h"
#include "parallel/embedding/planner.h"
#include "parallel/embedding/sharded_embedding_collection.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "runtime/sparse/embedding_collection.h"
#include "runtime/sparse/row_sparse_grad.h"
#include "tests/testing/sharding_fixtures.h"
#include "tests/testing/tensor_testing.h"

namespace mt::parallel {
namespace {

using runtime::Tensor;
using runtime::sparse::CollectionOptions;
using runtime::sparse::EmbeddingCollection;
using runtime::sparse::EmbeddingCollectionOutput;
using runtime::sparse::EmbeddingConfig;
using runtime::sparse::GradientMode;
using runtime::sparse::KeyedJaggedTensor;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(MpiProcessGroup::world());
  return pg;
}

int default_local() { return world()->size() % 2 == 0 ? 2 : world()->size(); }

using testing::all_feature_names;
using testing::mix64;

ShardingPlan uniform_plan(const std::vector<EmbeddingConfig>& tables, ShardingType type) {
  return testing::uniform_sharding_plan(tables, type, world()->size(),
                                        type == ShardingType::TableRowWise ? default_local() : 0);
}

std::vector<EmbeddingConfig> make_tables() {
  auto t = [](std::string name, int64_t rows, int64_t dim, std::vector<std::string> features,
              runtime::sparse::EmbOptimType opt) {
    EmbeddingConfig c;
    c.name = std::move(name);
    c.num_embeddings = rows;
    c.embedding_dim = dim;
    c.feature_names = std::move(features);
    c.optimizer.type = opt;
    c.optimizer.lr = 0.3;
    c.optimizer.eps = 1e-6;
    return c;
  };
  using runtime::sparse::EmbOptimType;
  return {t("t_big", 23, 4, {"a", "b"}, EmbOptimType::RowwiseAdagrad),  // "b" never has ids
          t("t_adam", 13, 6, {"c"}, EmbOptimType::Adam),
          t("t_small", 3, 5, {"d"}, EmbOptimType::RowwiseAdagrad),  // empty row blocks
          t("t_pra", 11, 3, {"e", "f"}, EmbOptimType::PartialRowwiseAdam)};
}

ShardingPlan mixed_plan(const std::vector<EmbeddingConfig>& tables) {
  const int W = world()->size(), local = default_local();
  ShardingPlan plan;
  plan.world_size = W;
  plan.local_size = local;
  plan.tables["t_big"] = row_wise_sharding(tables[0], W);
  plan.tables["t_adam"] = column_wise_sharding(tables[1], {W - 1, 0});
  plan.tables["t_small"] = data_parallel_sharding(tables[2], W);
  plan.tables["t_pra"] = table_row_wise_sharding(tables[3], W / local - 1, local);
  return plan;
}

// Every rank's samples for one step, drawn from (seed, rank). Feature "b" is always empty; rank
// `empty_rank` has no samples.
struct RankBatch {
  int64_t batch = 0;
  std::vector<std::vector<std::vector<int64_t>>> ids;  // [feature][sample]
};

RankBatch make_batch(const std::vector<EmbeddingConfig>& tables, uint64_t seed, int rank,
                     int empty_rank) {
  RankBatch rb;
  rb.batch = rank == empty_rank ? 0 : 2 + (rank * 3 + int(seed)) % 4;
  uint64_t state = mix64(seed * 1000 + uint64_t(rank));
  auto next = [&](uint64_t n) {
    state = mix64(state);
    return state % n;
  };
  for (const auto& t : tables)
    for (const std::string& f : t.feature_names) {
      std::vector<std::vector<int64_t>> ids(size_t(rb.batch));
      for (int64_t b = 0; b < rb.batch; ++b) {
        const uint64_t len = f == "b" ? 0 : next(5);
        for (uint64_t i = 0; i < len; ++i)
          ids[size_t(b)].push_back(int64_t(next(uint64_t(t.num_embeddings))));
      }
      rb.ids.push_back(ids);
    }
  return rb;
}

KeyedJaggedTensor to_kjt(const std::vector<EmbeddingConfig>& tables,
                         const std::vector<const RankBatch*>& parts, bool reversed) {
  const std::vector<std::string> features = all_feature_names(tables);
  std::vector<std::string> keys;
  std::vector<int64_t> values, lengths;
  int64_t stride = 0;
  for (const RankBatch* p : parts) stride += p->batch;
  for (size_t i = 0; i < features.size(); ++i) {
    const size_t k = reversed ? features.size() - 1 - i : i;
    keys.push_back(features[k]);
    for (const RankBatch* p : parts)
      for (int64_t b = 0; b < p->batch; ++b) {
        const auto& ids = p->ids[k][size_t(b)];
        lengths.push_back(int64_t(ids.size()));
        values.insert(values.end(), ids.begin(), ids.end());
      }
  }
  return KeyedJaggedTensor::from_lengths(keys, values, lengths, {}, stride);
}

struct Case {
  ShardingPlan plan;
  int empty_rank = -1;
  GradientMode mode = GradientMode::Fused;
  int steps = 2;
};

std::string col_key(const std::string& table, int64_t col) {
  return table + "@" + std::to_string(col);
}

// The rows of samples [row0, row0 + B) of a per-key output of the global batch.
Tensor sample_rows(const runtime::sparse::JaggedTensor& jt, int64_t row0, int64_t B) {
  const std::vector<int64_t> o = jt.offsets.to_vector<int64_t>();
  return jt.values.narrow(0, o[size_t(row0)], o[size_t(row0 + B)] - o[size_t(row0)]);
}

void run_case(const Case& c, uint64_t seed) {
  const int W = world()->size(), me = world()->rank();
  const std::vector<EmbeddingConfig> tables = make_tables();
  const std::vector<std::string> features = all_feature_names(tables);
  CollectionOptions opts;
  opts.gradient_mode = c.mode;
  opts.dtype = runtime::DType::F64;

  ShardedEmbeddingCollection sharded(tables, c.plan, world(), opts);
  sharded.init_weights(seed);
  sharded.train();
  // The unsharded reference, plus one collection per column shard of a column_wise table (row-wise
  // optimizer state is per column shard, as TorchRec's).
  EmbeddingCollection full(tables, opts);
  full.init_weights(seed);
  full.train();
  std::map<std::string, std::shared_ptr<EmbeddingCollection>> column;
  std::map<std::string, size_t> feature_table;
  for (size_t ti = 0; ti < tables.size(); ++ti) {
    const auto& t = tables[ti];
    for (const auto& f : t.feature_names) feature_table[f] = ti;
    const ParameterSharding& p = c.plan.at(t.name);
    if (p.type != ShardingType::ColumnWise) continue;
    for (const ShardMetadata& s : p.shards) {
      EmbeddingConfig part = t;
      part.shard = runtime::sparse::TableShard{0, -1, s.col_offset, s.num_cols};
      auto m = std::make_shared<EmbeddingCollection>(std::vector<EmbeddingConfig>{part}, opts);
      m->init_weights(seed);
      m->train();
      column[col_key(t.name, s.col_offset)] = m;
    }
  }

  for (int step = 0; step < c.steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const uint64_t data_seed = seed * 10 + uint64_t(step);
    std::vector<RankBatch> batches;
    for (int r = 0; r < W; ++r) batches.push_back(make_batch(tables, data_seed, r, c.empty_rank));
    std::vector<const RankBatch*> all;
    int64_t row0 = 0;
    for (int r = 0; r < W; ++r) {
      all.push_back(&batches[size_t(r)]);
      if (r < me) row0 += batches[size_t(r)].batch;
    }
    const int64_t B = batches[size_t(me)].batch;
    const KeyedJaggedTensor global = to_kjt(tables, all, false);
    const KeyedJaggedTensor local = to_kjt(tables, {&batches[size_t(me)]}, true);

    // Reference over the global batch; loss = sum over features of <rows, weights of the feature>.
    const EmbeddingCollectionOutput ref = full(global);
    std::map<std::string, Tensor> lw, expected;
    Tensor ref_loss = runtime::zeros({}, runtime::TensorOptions{}.with_dtype(runtime::DType::F64));
    for (size_t k = 0; k < features.size(); ++k) {
      const Tensor& rows = ref[features[k]].values;
      lw[features[k]] = testing::randn64(rows.shape(), 9000 + data_seed * 10 + k, false, "lw");
      ref_loss = runtime::add(ref_loss, runtime::sum(runtime::mul(rows, lw[features[k]])));
      expected[features[k]] = rows.detach().clone();
    }
    ref_loss.backward();
    // Column-wise tables: their columns come from the column-shard references (stepped per shard).
    for (auto& [key, m] : column) {
      const int64_t col = std::stoll(key.substr(key.find('@') + 1));
      const EmbeddingConfig& cfg = m->table_configs()[0];
      const int64_t w = cfg.shard.num_cols;
      const EmbeddingCollectionOutput part = (*m)(global);
      Tensor loss = runtime::zeros({}, runtime::TensorOptions{}.with_dtype(runtime::DType::F64));
      for (const auto& f : cfg.feature_names) {
        expected[f].narrow(1, col, w).copy_(part[f].values.detach());
        loss = runtime::add(
            loss, runtime::sum(runtime::mul(part[f].values, lw[f].narrow(1, col, w).contiguous())));
      }
      loss.backward();
    }

    // Sharded over this rank's samples (keys in reverse order).
    const EmbeddingCollectionOutput out = sharded(local);
    ASSERT_EQ(out.keys, features);
    Tensor loss = runtime::zeros({}, runtime::TensorOptions{}.with_dtype(runtime::DType::F64));
    for (size_t k = 0; k < features.size(); ++k) {
      const auto& jt = out[features[k]];
      const int64_t dim = tables[feature_table[features[k]]].embedding_dim;
      const Tensor want = sample_rows(ref[features[k]], row0, B);
      ASSERT_EQ(jt.values.shape(), (runtime::Shape{want.size(0), dim})) << features[k];
      EXPECT_TRUE(testing::all_close(jt.lengths, local[features[k]].lengths, 0, 0));
      EXPECT_TRUE(testing::all_close(
          jt.values,
          sample_rows({expected[features[k]], {}, ref[features[k]].offsets, {}}, row0, B), 1e-12,
          1e-12))
          << "rows of feature " << features[k] << " on rank " << me;
      loss = runtime::add(
          loss, runtime::sum(runtime::mul(
                    jt.values,
                    sample_rows({lw[features[k]], {}, ref[features[k]].offsets, {}}, row0, B))));
    }
    loss.backward();

    if (c.mode == GradientMode::RowSparse) {
      const std::vector<LocalShard> shards = sharded.local_shards();
      for (const auto& sg : sharded.sparse_grads()) {
        const LocalShard* shard = nullptr;
        for (const auto& s : shards)
          if (s.fqn == sg.fqn) shard = &s;
        ASSERT_NE(shard, nullptr) << sg.fqn;
        size_t ti = 0;
        while (tables[ti].name != shard->table) ++ti;
        Tensor want = runtime::zeros({tables[ti].num_embeddings, tables[ti].embedding_dim},
                                     runtime::TensorOptions{}.with_dtype(runtime::DType::F64));
        for (const auto& rg : full.sparse_grads())
          if (rg.table == int64_t(ti)) want = rg.to_dense();
        const ShardMetadata& pm = shard->placement;
        EXPECT_TRUE(testing::all_close(
            sg.grad.to_dense(),
            want.narrow(0, pm.row_offset, pm.num_rows).narrow(1, pm.col_offset, pm.num_cols), 1e-12,
            1e-12))
            << "gradient of " << sg.fqn << " on rank " << me;
      }
      Tensor partial =
          runtime::from_vector<double>({sharded.sparse_grad_norm_pow(2.0)}, {1},
                                       runtime::TensorOptions{}.with_dtype(runtime::DType::F64));
      world()->all_reduce(partial, ReduceOp::Sum, "test.norm");
      const double want_pow = runtime::sparse::row_sparse_norm_pow(full.sparse_grads(), 2.0);
      EXPECT_NEAR(partial.item<double>(), want_pow, 1e-10 * (1 + want_pow));
      sharded.apply_sparse_grads();
      full.apply_sparse_grads();
      for (auto& [key, m] : column) m->apply_sparse_grads();
    }

    // Updated rows and every piece of fused optimizer state.
    const runtime::nn::StateDict state = sharded.optimizer_state_dict();
    const runtime::nn::StateDict ref_state = full.optimizer_state_dict();
    for (const LocalShard& s : sharded.local_shards()) {
      size_t ti = 0;
      while (tables[ti].name != s.table) ++ti;
      const ShardMetadata& pm = s.placement;
      Tensor want_w;
      runtime::nn::StateDict want_state;
      if (s.type == ShardingType::ColumnWise) {
        const auto& m = column.at(col_key(s.table, pm.col_offset));
        want_w = m->weights()[0];
        want_state = m->optimizer_state_dict();
      } else {
        want_w = full.weights()[ti]
                     .narrow(0, pm.row_offset, pm.num_rows)
                     .narrow(1, pm.col_offset, pm.num_cols);
        want_state = ref_state;
      }
      EXPECT_TRUE(testing::all_close(s.weight, want_w, 1e-12, 1e-12))
          << "updated rows of " << s.fqn << " (" << sharding_type_name(s.type) << ") on rank "
          << me;
      int pieces = 0;
      for (const auto& [key, value] : want_state) {
        if (key.rfind(s.fqn + ".", 0) != 0) continue;
        ++pieces;
        const Tensor want = value.dim() == 0 || s.type == ShardingType::ColumnWise
                                ? value
                                : value.narrow(0, pm.row_offset, pm.num_rows);
        EXPECT_TRUE(testing::all_close(state.at(key), want, 1e-12, 1e-12))
            << "optimizer state " << key << " on rank " << me;
      }
      EXPECT_GE(pieces, 2) << s.fqn;  // a moment and the step count
      EXPECT_EQ(s.global_shape,
                (std::vector<int64_t>{tables[ti].num_embeddings, tables[ti].embedding_dim}));
    }
  }
}

class ShardingTypes : public ::testing::TestWithParam<ShardingType> {};

TEST_P(ShardingTypes, FusedMatchesUnshardedWithAnEmptyRank) {
  const auto tables = make_tables();
  Case c{uniform_plan(tables, GetParam())};
  c.empty_rank = world()->size() - 1;
  run_case(c, 1);
}

TEST_P(ShardingTypes, RowSparseGradientsMatchUnsharded) {
  const auto tables = make_tables();
  Case c{uniform_plan(tables, GetParam())};
  c.mode = GradientMode::RowSparse;
  c.empty_rank = 0;
  run_case(c, 2);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ShardingTypes,
                         ::testing::Values(ShardingType::DataParallel, ShardingType::TableWise,
                                           ShardingType::ColumnWise, ShardingType::RowWise,
                                           ShardingType::TableRowWise),
                         [](const auto& info) {
                           return std::string(sharding_type_name(info.param));
                         });

TEST(ShardedEmbeddingCollection, MixedPlanMatchesUnsharded) {
  const auto tables = make_tables();
  for (GradientMode mode : {GradientMode::Fused, GradientMode::RowSparse}) {
    Case c{mixed_plan(tables)};
    c.mode = mode;
    c.empty_rank = world()->size() / 2;
    c.steps = 3;
    run_case(c, 5);
  }
}

TEST(ShardedEmbeddingCollection, PlannerPlanMatchesUnsharded) {
  const auto tables = make_tables();
  PlannerOptions o;
  o.world_size = world()->size();
  o.memory_budget_bytes = 1 << 20;
  o.batch_size_per_rank = 4;
  Case c{plan_sharding(tables, o)};
  c.empty_rank = 1;
  run_case(c, 6);
}

TEST(ShardedEmbeddingCollection, EvalModeGivesTheRowsAndRecordsNothing) {
  // Outside training: the same rows, no graph, no optimizer step (a second forward still matches).
  const auto tables = make_tables();
  CollectionOptions opts;
  opts.dtype = runtime::DType::F64;
  ShardedEmbeddingCollection sharded(tables, mixed_plan(tables), world(), opts);
  EmbeddingCollection full(tables, opts);
  sharded.init_weights(8);
  full.init_weights(8);
  sharded.eval();
  full.eval();
  const int W = world()->size(), me = world()->rank();
  std::vector<RankBatch> batches;
  std::vector<const RankBatch*> all;
  int64_t row0 = 0;
  for (int r = 0; r < W; ++r) batches.push_back(make_batch(tables, 60, r, 0));
  for (int r = 0; r < W; ++r) {
    all.push_back(&batches[size_t(r)]);
    if (r < me) row0 += batches[size_t(r)].batch;
  }
  const EmbeddingCollectionOutput ref = full(to_kjt(tables, all, false));
  for (int pass = 0; pass < 2; ++pass) {
    const EmbeddingCollectionOutput out = sharded(to_kjt(tables, {&batches[size_t(me)]}, true));
    EXPECT_FALSE(out.flat.requires_grad());
    for (const std::string& f : all_feature_names(tables))
      EXPECT_TRUE(testing::all_close(out[f].values,
                                     sample_rows(ref[f], row0, batches[size_t(me)].batch), 0, 0))
          << f << " pass " << pass;
  }
}

TEST(ShardedEmbeddingCollection, EveryBatchEmpty) {
  const auto tables = make_tables();
  CollectionOptions opts;
  opts.dtype = runtime::DType::F64;
  ShardedEmbeddingCollection sharded(tables, mixed_plan(tables), world(), opts);
  sharded.init_weights(7);
  sharded.train();
  std::vector<Tensor> before;
  for (const auto& s : sharded.local_shards()) before.push_back(s.weight.clone());
  RankBatch empty;
  empty.ids.resize(all_feature_names(tables).size());
  const auto out = sharded(to_kjt(tables, {&empty}, false));
  EXPECT_EQ(out.flat.numel(), 0);
  ASSERT_EQ(out.per_key.size(), all_feature_names(tables).size());
  EXPECT_EQ(out["c"].values.shape(), (runtime::Shape{0, 6}));
  runtime::sum(out.flat).backward();
  const auto shards = sharded.local_shards();
  ASSERT_EQ(shards.size(), before.size());
  for (size_t i = 0; i < shards.size(); ++i)
    EXPECT_TRUE(testing::all_close(shards[i].weight, before[i], 0, 0)) << shards[i].fqn;
}

TEST(ShardedEmbeddingCollection, StateRoundTripContinuesIdentically) {
  const auto tables = make_tables();
  CollectionOptions opts;
  opts.dtype = runtime::DType::F64;
  ShardedEmbeddingCollection a(tables, mixed_plan(tables), world(), opts);
  ShardedEmbeddingCollection b(tables, mixed_plan(tables), world(), opts);
  a.init_weights(11);
  b.init_weights(12);
  a.train();
  b.train();
  const RankBatch first = make_batch(tables, 40, world()->rank(), -1);
  const RankBatch second = make_batch(tables, 41, world()->rank(), -1);
  runtime::sum(a(to_kjt(tables, {&first}, false)).flat).backward();
  b.load_state_dict(a.state_dict());
  b.load_optimizer_state_dict(a.optimizer_state_dict());
  for (auto* m : {&a, &b}) runtime::sum((*m)(to_kjt(tables, {&second}, false)).flat).backward();
  const auto sa = a.local_shards(), sb = b.local_shards();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].fqn, "embeddings." + sa[i].table + ".weight");
    EXPECT_TRUE(testing::all_close(sa[i].weight, sb[i].weight, 0, 0)) << sa[i].fqn;
  }
}

TEST(ShardedEmbeddingCollection, ErrorsNameTheProblem) {
  const auto tables = make_tables();
  const int W = world()->size();
  auto message = [&](ShardingPlan plan, CollectionOptions opts) -> std::string {
    try {
      ShardedEmbeddingCollection m(tables, std::move(plan), world(), opts);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  CollectionOptions opts;
  ShardingPlan plan = uniform_plan(tables, ShardingType::TableWise);
  plan.world_size = W + 1;
  EXPECT_NE(message(plan, opts).find("ranks"), std::string::npos) << message(plan, opts);
  plan = uniform_plan(tables, ShardingType::RowWise);
  plan.tables.erase("t_adam");
  EXPECT_NE(message(plan, opts).find("t_adam"), std::string::npos) << message(plan, opts);
  opts.gradient_mode = GradientMode::Dense;
  EXPECT_NE(message(uniform_plan(tables, ShardingType::RowWise), opts).find("Dense"),
            std::string::npos);
  opts.gradient_mode = GradientMode::Fused;
  opts.is_weighted = true;
  EXPECT_NE(message(uniform_plan(tables, ShardingType::RowWise), opts).find("weights"),
            std::string::npos);
  opts.is_weighted = false;
  {  // kv-backed tables are for the pooled collection only
    auto kv = tables;
    kv[0].storage = runtime::sparse::TableStorage::Kv;
    std::string m = "no error";
    try {
      ShardedEmbeddingCollection c(kv, uniform_plan(kv, ShardingType::RowWise), world(), opts);
    } catch (const Error& e) {
      m = e.what();
    }
    EXPECT_NE(m.find("memory tables only"), std::string::npos) << m;
  }
  // An id out of range is refused before any collective (every rank's input is bad here).
  ShardedEmbeddingCollection sharded(tables, uniform_plan(tables, ShardingType::RowWise), world(),
                                     CollectionOptions{});
  std::vector<std::string> keys = all_feature_names(tables);
  std::vector<int64_t> lengths(keys.size(), 0), values{99};
  lengths[0] = 1;
  try {
    sharded(KeyedJaggedTensor::from_lengths(keys, values, lengths, {}, 1));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t_big"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::parallel
