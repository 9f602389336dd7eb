// ShardedEmbeddingBagCollection on real ranks (mpirun -np 2, 3 and 4): for every sharding type and
// a mixed plan, the pooled outputs, the row-sparse gradients and the rows (and row-wise Adagrad
// state) after fused steps equal an unsharded single-process EmbeddingBagCollection over the
// global batch, which every rank builds itself from the same seed. The batches have an empty
// feature, a rank with an empty batch, uneven batch sizes, MEAN and SUM tables, per-sample
// weights, duplicate ids, and row blocks that are empty on some ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/mpi_process_group.h"
#include "parallel/embedding/planner.h"
#include "parallel/embedding/sharded_embedding_bag_collection.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "runtime/sparse/embedding_bag_collection.h"
#include "runtime/sparse/row_sparse_grad.h"
#include "tests/testing/errors.h"
#include "tests/testing/sharding_fixtures.h"
#include "tests/testing/tensor_testing.h"

namespace mt::parallel {
namespace {

using runtime::Tensor;
using runtime::sparse::CollectionOptions;
using runtime::sparse::EmbeddingBagCollection;
using runtime::sparse::GradientMode;
using runtime::sparse::KeyedJaggedTensor;
using testing::all_feature_names;
using testing::mix64;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(MpiProcessGroup::world());
  return pg;
}

// (node, local) meshes, made once per local size (collective: every rank makes the same ones in
// the same order).
std::shared_ptr<DeviceMesh> node_mesh(int local) {
  static std::map<int, std::shared_ptr<DeviceMesh>> meshes;
  auto it = meshes.find(local);
  if (it != meshes.end()) return it->second;
  auto mesh = DeviceMesh::create(world(), {world()->size() / local, local}, {"node", "local"});
  meshes[local] = mesh;
  return mesh;
}

// A local size for table_row_wise: 2 where it divides the world (2 nodes of 2 on 4 ranks).
int default_local() { return world()->size() % 2 == 0 ? 2 : world()->size(); }

ShardingPlan uniform_plan(const std::vector<EmbeddingBagConfig>& tables, ShardingType type,
                          int local) {
  return testing::uniform_sharding_plan(tables, type, world()->size(), local);
}

std::vector<EmbeddingBagConfig> make_tables() {
  auto t = [](std::string name, int64_t rows, int64_t dim, std::vector<std::string> features,
              runtime::PoolingMode pooling) {
    EmbeddingBagConfig c;
    c.name = std::move(name);
    c.num_embeddings = rows;
    c.embedding_dim = dim;
    c.feature_names = std::move(features);
    c.pooling = pooling;
    c.optimizer.type = runtime::sparse::EmbOptimType::RowwiseAdagrad;
    c.optimizer.lr = 0.3;
    c.optimizer.eps = 1e-6;
    return c;
  };
  using runtime::PoolingMode;
  return {t("t_big", 23, 4, {"a", "b"}, PoolingMode::Sum),  // "b" never has ids
          t("t_mean", 13, 6, {"c"}, PoolingMode::Mean),
          t("t_small", 3, 5, {"d"}, PoolingMode::Sum),  // row blocks empty on some ranks
          t("t_mean2", 11, 3, {"e", "f"}, PoolingMode::Mean)};
}

// The same type for every table, placed so that ranks differ (table t's owner is t mod world).
ShardingPlan mixed_plan(const std::vector<EmbeddingBagConfig>& tables, int local) {
  const int W = world()->size();
  ShardingPlan plan;
  plan.world_size = W;
  plan.local_size = local;
  plan.tables["t_big"] = row_wise_sharding(tables[0], W);
  plan.tables["t_mean"] = column_wise_sharding(tables[1], {W - 1, 0});
  plan.tables["t_small"] = data_parallel_sharding(tables[2], W);
  plan.tables["t_mean2"] = table_row_wise_sharding(tables[3], W / local - 1, local);
  return plan;
}

// Every rank's samples for one step, drawn from (seed, rank): per feature and sample a list of
// ids (and weights). Feature "b" is always empty; rank `empty_rank` has no samples.
struct RankBatch {
  int64_t batch = 0;
  std::vector<std::vector<std::vector<int64_t>>> ids;  // [feature][sample]
  std::vector<std::vector<std::vector<float>>> weights;
};

RankBatch make_batch(const std::vector<EmbeddingBagConfig>& tables, uint64_t seed, int rank,
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
      std::vector<std::vector<float>> w(size_t(rb.batch));
      for (int64_t b = 0; b < rb.batch; ++b) {
        const uint64_t len = f == "b" ? 0 : next(5);  // 0..4, duplicates likely
        for (uint64_t i = 0; i < len; ++i) {
          ids[size_t(b)].push_back(int64_t(next(uint64_t(t.num_embeddings))));
          w[size_t(b)].push_back(0.25f + 0.25f * float(next(6)));
        }
      }
      rb.ids.push_back(ids);
      rb.weights.push_back(w);
    }
  return rb;
}

// The KJT of the given ranks' samples (concatenated in rank order), keys in `key_order`
// (indices into the features).
KeyedJaggedTensor to_kjt(const std::vector<EmbeddingBagConfig>& tables,
                         const std::vector<const RankBatch*>& parts,
                         const std::vector<size_t>& key_order) {
  const std::vector<std::string> features = all_feature_names(tables);
  std::vector<std::string> keys;
  std::vector<int64_t> values, lengths;
  std::vector<float> weights;
  int64_t stride = 0;
  for (const RankBatch* p : parts) stride += p->batch;
  for (size_t k : key_order) {
    keys.push_back(features[k]);
    for (const RankBatch* p : parts)
      for (int64_t b = 0; b < p->batch; ++b) {
        const auto& ids = p->ids[k][size_t(b)];
        lengths.push_back(int64_t(ids.size()));
        values.insert(values.end(), ids.begin(), ids.end());
        weights.insert(weights.end(), p->weights[k][size_t(b)].begin(),
                       p->weights[k][size_t(b)].end());
      }
  }
  return KeyedJaggedTensor::from_lengths(keys, values, lengths, weights, stride);
}

// The loss weights [G, D] of one step (the same on every rank).
Tensor loss_weights(int64_t rows, int64_t cols, uint64_t seed) {
  return testing::randn64({rows, cols}, 9000 + seed, false, "loss_weights");
}

struct Case {
  ShardingPlan plan;
  int local = 0;  // mesh local size (table_row_wise)
  bool weighted = false;
  int empty_rank = -1;
  GradientMode mode = GradientMode::Fused;
  int steps = 2;
  std::shared_ptr<ProcessGroup> output_group = nullptr;  // null: the world
};

// The unsharded references: the whole collection, plus one collection per column shard of a
// column_wise table (row-wise Adagrad state is per column shard, as TorchRec's).
struct Reference {
  std::shared_ptr<EmbeddingBagCollection> full;
  std::map<std::string, std::shared_ptr<EmbeddingBagCollection>> column;  // "<table>@<col>"
};

std::string col_key(const std::string& table, int64_t col) {
  return table + "@" + std::to_string(col);
}

void run_case(const Case& c, uint64_t seed) {
  const int W = world()->size(), me = world()->rank();
  const std::vector<EmbeddingBagConfig> tables = make_tables();
  const std::vector<std::string> features = all_feature_names(tables);
  CollectionOptions opts;
  opts.gradient_mode = c.mode;
  opts.dtype = runtime::DType::F64;
  opts.is_weighted = c.weighted;

  ShardedEmbeddingBagCollection sharded(tables, c.plan, world(),
                                        c.local > 0 ? node_mesh(c.local) : nullptr, opts,
                                        c.output_group);
  sharded.init_weights(seed);
  sharded.train();
  Reference ref;
  ref.full = std::make_shared<EmbeddingBagCollection>(tables, opts);
  ref.full->init_weights(seed);
  ref.full->train();
  for (const auto& t : tables) {
    const ParameterSharding& p = c.plan.at(t.name);
    if (p.type != ShardingType::ColumnWise) continue;
    for (const ShardMetadata& s : p.shards) {
      EmbeddingBagConfig part = t;
      part.shard = runtime::sparse::TableShard{0, -1, s.col_offset, s.num_cols};
      auto m =
          std::make_shared<EmbeddingBagCollection>(std::vector<EmbeddingBagConfig>{part}, opts);
      m->init_weights(seed);
      m->train();
      ref.column[col_key(t.name, s.col_offset)] = m;
    }
  }
  // Feature output columns.
  std::map<std::string, int64_t> out_col;
  int64_t D = 0;
  for (const auto& t : tables)
    for (const auto& f : t.feature_names) {
      out_col[f] = D;
      D += t.embedding_dim;
    }
  std::vector<size_t> natural(features.size()), reversed(features.size());
  for (size_t k = 0; k < features.size(); ++k) {
    natural[k] = k;
    reversed[k] = features.size() - 1 - k;
  }

  for (int step = 0; step < c.steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const uint64_t data_seed = seed * 10 + uint64_t(step);
    std::vector<RankBatch> batches;
    for (int r = 0; r < W; ++r) batches.push_back(make_batch(tables, data_seed, r, c.empty_rank));
    std::vector<const RankBatch*> all;
    int64_t G = 0, row0 = 0;
    for (int r = 0; r < W; ++r) {
      all.push_back(&batches[size_t(r)]);
      if (r < me) row0 += batches[size_t(r)].batch;
      G += batches[size_t(r)].batch;
    }
    const int64_t B = batches[size_t(me)].batch;
    const KeyedJaggedTensor global = to_kjt(tables, all, natural);
    const KeyedJaggedTensor local = to_kjt(tables, {&batches[size_t(me)]}, reversed);
    const Tensor lw = loss_weights(G, D, data_seed);

    // Reference over the global batch.
    const Tensor ref_out = ref.full->operator()(global).values;
    runtime::sum(runtime::mul(ref_out, lw)).backward();
    // Column-wise tables: their columns come from the column-shard references (whose rows,
    // stepped per shard, differ from the whole table's after the first step).
    const Tensor expected_out = ref_out.detach().clone();
    for (auto& [key, m] : ref.column) {
      const int64_t col = std::stoll(key.substr(key.find('@') + 1));
      const EmbeddingBagConfig& cfg = m->table_configs()[0];
      const int64_t w = cfg.shard.num_cols;
      const Tensor part = m->operator()(global).values;
      std::vector<Tensor> cols;
      for (size_t i = 0; i < cfg.feature_names.size(); ++i) {
        const int64_t c = out_col[cfg.feature_names[i]] + col;
        cols.push_back(lw.narrow(1, c, w));
        expected_out.narrow(1, c, w).copy_(part.detach().narrow(1, int64_t(i) * w, w));
      }
      runtime::sum(runtime::mul(part, runtime::cat(cols, 1))).backward();
    }

    // Sharded over this rank's samples.
    const runtime::sparse::KeyedTensor out = sharded(local);
    ASSERT_EQ(out.keys, features);
    ASSERT_EQ(out.values.shape(), (runtime::Shape{B, D}));
    EXPECT_TRUE(testing::all_close(out.values, expected_out.narrow(0, row0, B), 1e-12, 1e-12))
        << "pooled output, rank " << me;
    runtime::sum(runtime::mul(out.values, lw.narrow(0, row0, B))).backward();

    if (c.mode == GradientMode::RowSparse) {
      // Gradients: each kept shard gradient equals the reference's rows/columns of the table.
      const std::vector<LocalShard> shards = sharded.local_shards();
      for (const auto& sg : sharded.sparse_grads()) {
        const LocalShard* shard = nullptr;
        for (const auto& s : shards)
          if (s.fqn == sg.fqn) shard = &s;
        ASSERT_NE(shard, nullptr) << sg.fqn;
        size_t ti = 0;
        while (tables[ti].name != shard->table) ++ti;
        Tensor expected = runtime::zeros({tables[ti].num_embeddings, tables[ti].embedding_dim},
                                         runtime::TensorOptions{}.with_dtype(runtime::DType::F64));
        for (const auto& rg : ref.full->sparse_grads())
          if (rg.table == int64_t(ti)) expected = rg.to_dense();
        const ShardMetadata& pm = shard->placement;
        EXPECT_TRUE(testing::all_close(
            sg.grad.to_dense(),
            expected.narrow(0, pm.row_offset, pm.num_rows).narrow(1, pm.col_offset, pm.num_cols),
            1e-12, 1e-12))
            << "gradient of " << sg.fqn << " on rank " << me;
      }
      // Each shard counted once in the norm.
      Tensor partial =
          runtime::from_vector<double>({sharded.sparse_grad_norm_pow(2.0)}, {1},
                                       runtime::TensorOptions{}.with_dtype(runtime::DType::F64));
      world()->all_reduce(partial, ReduceOp::Sum, "test.norm");
      const double expected_pow =
          runtime::sparse::row_sparse_norm_pow(ref.full->sparse_grads(), 2.0);
      EXPECT_NEAR(partial.item<double>(), expected_pow, 1e-10 * (1 + expected_pow));
      sharded.apply_sparse_grads();
      ref.full->apply_sparse_grads();
      for (auto& [key, m] : ref.column) m->apply_sparse_grads();
    }

    // Updated rows and row-wise Adagrad state.
    const runtime::nn::StateDict state = sharded.optimizer_state_dict();
    const runtime::nn::StateDict ref_state = ref.full->optimizer_state_dict();
    for (const LocalShard& s : sharded.local_shards()) {
      size_t ti = 0;
      while (tables[ti].name != s.table) ++ti;
      Tensor expected_w, expected_m;
      if (s.type == ShardingType::ColumnWise) {
        const auto& m = ref.column.at(col_key(s.table, s.placement.col_offset));
        expected_w = m->weights()[0];
        expected_m = m->optimizer_state_dict().at(s.fqn + ".momentum1");
      } else {
        expected_w = ref.full->weights()[ti]
                         .narrow(0, s.placement.row_offset, s.placement.num_rows)
                         .narrow(1, s.placement.col_offset, s.placement.num_cols);
        expected_m = ref_state.at(s.fqn + ".momentum1")
                         .narrow(0, s.placement.row_offset, s.placement.num_rows);
      }
      EXPECT_TRUE(testing::all_close(s.weight, expected_w, 1e-12, 1e-12))
          << "updated rows of " << s.fqn << " (" << sharding_type_name(s.type) << ") on rank "
          << me;
      EXPECT_TRUE(testing::all_close(state.at(s.fqn + ".momentum1"), expected_m, 1e-12, 1e-12))
          << "Adagrad state of " << s.fqn << " on rank " << me;
      EXPECT_EQ(s.global_shape,
                (std::vector<int64_t>{tables[ti].num_embeddings, tables[ti].embedding_dim}));
    }
  }
}

class ShardingTypes : public ::testing::TestWithParam<ShardingType> {};

TEST_P(ShardingTypes, FusedAdagradMatchesUnsharded) {
  const ShardingType type = GetParam();
  const int local = type == ShardingType::TableRowWise ? default_local() : 0;
  const auto tables = make_tables();
  Case c{uniform_plan(tables, type, local), local};
  run_case(c, 1);
}

TEST_P(ShardingTypes, WeightedWithAnEmptyRankMatchesUnsharded) {
  const ShardingType type = GetParam();
  const int local = type == ShardingType::TableRowWise ? default_local() : 0;
  const auto tables = make_tables();
  Case c{uniform_plan(tables, type, local), local};
  c.weighted = true;
  c.empty_rank = world()->size() - 1;
  run_case(c, 2);
}

TEST_P(ShardingTypes, RowSparseGradientsMatchUnsharded) {
  const ShardingType type = GetParam();
  const int local = type == ShardingType::TableRowWise ? default_local() : 0;
  const auto tables = make_tables();
  Case c{uniform_plan(tables, type, local), local};
  c.mode = GradientMode::RowSparse;
  c.weighted = true;
  c.empty_rank = 0;
  run_case(c, 3);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ShardingTypes,
                         ::testing::Values(ShardingType::DataParallel, ShardingType::TableWise,
                                           ShardingType::ColumnWise, ShardingType::RowWise,
                                           ShardingType::TableRowWise),
                         [](const auto& info) {
                           return std::string(sharding_type_name(info.param));
                         });

TEST(ShardedEmbedding, TableRowWiseOneRankPerNode) {
  // local = 1: the reduce-scatter is within one rank, the all-to-all across every node.
  const auto tables = make_tables();
  Case c{uniform_plan(tables, ShardingType::TableRowWise, 1), 1};
  c.weighted = true;
  c.empty_rank = 1;
  run_case(c, 4);
}

TEST(ShardedEmbedding, MixedPlanMatchesUnsharded) {
  const auto tables = make_tables();
  for (GradientMode mode : {GradientMode::Fused, GradientMode::RowSparse}) {
    Case c{mixed_plan(tables, default_local()), default_local()};
    c.mode = mode;
    c.weighted = mode == GradientMode::RowSparse;
    c.empty_rank = world()->size() / 2;
    c.steps = 3;
    run_case(c, 5);
  }
}

// The pooled outputs over a group of their own (the same ranks, as an NCCL group for GPU tables
// is): the same results, every output collective is that group's and the ids stay on the world.
TEST(ShardedEmbedding, OutputGroupCarriesTheOutputExchange) {
  const auto tables = make_tables();
  std::shared_ptr<ProcessGroup> outputs(world()->split(0, world()->rank()));
  for (GradientMode mode : {GradientMode::Fused, GradientMode::RowSparse}) {
    Case c{mixed_plan(tables, default_local()), default_local()};
    c.mode = mode;
    c.output_group = outputs;
    world()->reset_stats();
    outputs->reset_stats();
    run_case(c, 9);
    const auto on_world = world()->stats(), on_outputs = outputs->stats();
    for (const char* name : {"sebc.tw.output", "sebc.tw.output.backward", "sebc.rw.reduce_scatter",
                             "sebc.rw.all_gather", "sebc.dp.grad_all_reduce"}) {
      EXPECT_EQ(on_outputs.count(name), 1u) << name;
      EXPECT_EQ(on_world.count(name), 0u) << name;
    }
    for (const char* name : {"sebc.batch_sizes", "sebc.input.lengths", "sebc.input.values"}) {
      EXPECT_EQ(on_world.count(name), 1u) << name;
      EXPECT_EQ(on_outputs.count(name), 0u) << name;
    }
  }
  // A group of other ranks (or another order) is refused.
  if (world()->size() > 1) {
    const int W = world()->size();  // rotated by one: no rank keeps its place
    std::shared_ptr<ProcessGroup> rotated(world()->split(0, (world()->rank() + 1) % W));
    CollectionOptions opts;
    opts.dtype = runtime::DType::F64;
    EXPECT_NE(testing::error_of([&] {
                ShardedEmbeddingBagCollection(tables, mixed_plan(tables, default_local()),
                                              world(), node_mesh(default_local()), opts, rotated);
              }).find("must hold the ranks of"),
              std::string::npos);
  }
}

TEST(ShardedEmbedding, PlannerPlanMatchesUnsharded) {
  const auto tables = make_tables();
  PlannerOptions o;
  o.world_size = world()->size();
  o.memory_budget_bytes = 1 << 20;
  o.batch_size_per_rank = 4;
  const ShardingPlan plan = plan_sharding(tables, o);
  if (world()->rank() == 0) std::cout << plan.describe(tables, runtime::DType::F64);
  Case c{plan, 0};
  run_case(c, 6);
}

TEST(ShardedEmbedding, EveryBatchEmpty) {
  // All batches empty: every collective still runs (zero-length pieces) and no row changes.
  const auto tables = make_tables();
  const int local = default_local();
  CollectionOptions opts;
  opts.dtype = runtime::DType::F64;
  opts.is_weighted = true;  // an empty batch needs no weights
  ShardedEmbeddingBagCollection sharded(tables, mixed_plan(tables, local), world(),
                                        node_mesh(local), opts);
  sharded.init_weights(7);
  sharded.train();
  std::vector<Tensor> before;
  for (const auto& s : sharded.local_shards()) before.push_back(s.weight.clone());
  const size_t F = all_feature_names(tables).size();
  RankBatch empty;
  empty.ids.resize(F);
  empty.weights.resize(F);
  std::vector<size_t> order(F);
  for (size_t k = 0; k < F; ++k) order[k] = k;
  const auto out = sharded(to_kjt(tables, {&empty}, order));
  EXPECT_EQ(out.values.shape(), (runtime::Shape{0, 4 + 4 + 6 + 5 + 3 + 3}));
  runtime::sum(out.values).backward();
  const auto shards = sharded.local_shards();
  ASSERT_EQ(shards.size(), before.size());
  for (size_t i = 0; i < shards.size(); ++i)
    EXPECT_TRUE(testing::all_close(shards[i].weight, before[i], 0, 0)) << shards[i].fqn;
}

TEST(ShardedEmbedding, DenseLayerAboveGetsTheUsualGradients) {
  // A dense layer on the pooled output (as DLRM's interaction / top MLP): its weight gradient,
  // summed over ranks, and the fused table updates equal the single-process run.
  const auto tables = make_tables();
  const int local = default_local();
  const int W = world()->size(), me = world()->rank();
  CollectionOptions opts;
  opts.dtype = runtime::DType::F64;
  ShardedEmbeddingBagCollection sharded(tables, mixed_plan(tables, local), world(),
                                        node_mesh(local), opts);
  EmbeddingBagCollection ref(tables, opts);
  sharded.init_weights(21);
  ref.init_weights(21);
  sharded.train();
  ref.train();
  const int64_t D = 4 + 4 + 6 + 5 + 3 + 3;
  const Tensor dense_ref = testing::randn64({D, 2}, 77);
  const Tensor dense = testing::randn64({D, 2}, 77);
  std::vector<RankBatch> batches;
  std::vector<const RankBatch*> all;
  for (int r = 0; r < W; ++r) batches.push_back(make_batch(tables, 50, r, 1));
  for (int r = 0; r < W; ++r) all.push_back(&batches[size_t(r)]);
  std::vector<size_t> order(all_feature_names(tables).size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  auto loss_of = [](const Tensor& pooled, const Tensor& w) {
    return runtime::sum(runtime::square(runtime::tanh(runtime::matmul(pooled, w))));
  };
  loss_of(ref(to_kjt(tables, all, order)).values, dense_ref).backward();
  loss_of(sharded(to_kjt(tables, {&batches[size_t(me)]}, order)).values, dense).backward();
  ASSERT_TRUE(dense.grad().defined());
  const Tensor summed = dense.grad().clone();
  world()->all_reduce(summed, ReduceOp::Sum, "test.dense_grad");
  EXPECT_TRUE(testing::all_close(summed, dense_ref.grad(), 1e-12, 1e-12));
  for (const LocalShard& s : sharded.local_shards()) {
    size_t ti = 0;
    while (tables[ti].name != s.table) ++ti;
    if (s.type == ShardingType::ColumnWise) continue;  // per-shard Adagrad state: see run_case
    EXPECT_TRUE(testing::all_close(s.weight,
                                   ref.weights()[ti]
                                       .narrow(0, s.placement.row_offset, s.placement.num_rows)
                                       .narrow(1, s.placement.col_offset, s.placement.num_cols),
                                   1e-12, 1e-12))
        << s.fqn;
  }
}

TEST(ShardedEmbedding, StateRoundTripContinuesIdentically) {
  // Weights and row-optimizer state saved from one collection and loaded into a fresh one with
  // the same plan: the next step gives identical rows (what a checkpoint relies on).
  const auto tables = make_tables();
  const int local = default_local();
  CollectionOptions opts;
  opts.dtype = runtime::DType::F64;
  const ShardingPlan plan = mixed_plan(tables, local);
  ShardedEmbeddingBagCollection a(tables, plan, world(), node_mesh(local), opts);
  ShardedEmbeddingBagCollection b(tables, plan, world(), node_mesh(local), opts);
  a.init_weights(11);
  b.init_weights(12);
  a.train();
  b.train();
  std::vector<size_t> order(all_feature_names(tables).size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  const RankBatch first = make_batch(tables, 40, world()->rank(), -1);
  const RankBatch second = make_batch(tables, 41, world()->rank(), -1);
  runtime::sum(a(to_kjt(tables, {&first}, order)).values).backward();
  b.load_state_dict(a.state_dict());
  b.load_optimizer_state_dict(a.optimizer_state_dict());
  for (auto* m : {&a, &b}) runtime::sum((*m)(to_kjt(tables, {&second}, order)).values).backward();
  const auto sa = a.local_shards(), sb = b.local_shards();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_TRUE(testing::all_close(sa[i].weight, sb[i].weight, 0, 0)) << sa[i].fqn;
  for (const auto& [key, value] : a.optimizer_state_dict())
    EXPECT_TRUE(testing::all_close(value, b.optimizer_state_dict().at(key), 0, 0)) << key;
  runtime::nn::StateDict bad = a.optimizer_state_dict();
  bad.insert("embedding_bags.nope.weight.momentum1", runtime::zeros({1, 1}));
  EXPECT_THROW(b.load_optimizer_state_dict(bad), Error);
}

TEST(ShardedEmbedding, ErrorsNameTheProblem) {
  const auto tables = make_tables();
  const int W = world()->size();
  CollectionOptions opts;
  ShardingPlan plan = uniform_plan(tables, ShardingType::TableWise, 0);
  plan.world_size = W + 1;
  EXPECT_THROW(ShardedEmbeddingBagCollection(tables, plan, world(), nullptr, opts), Error);
  plan = uniform_plan(tables, ShardingType::TableRowWise, 1);
  EXPECT_THROW(ShardedEmbeddingBagCollection(tables, plan, world(), nullptr, opts), Error);
  opts.gradient_mode = GradientMode::Dense;
  EXPECT_THROW(ShardedEmbeddingBagCollection(tables, uniform_plan(tables, ShardingType::RowWise, 0),
                                             world(), nullptr, opts),
               Error);
  // An id out of range is refused before any collective (every rank's input is bad here).
  opts.gradient_mode = GradientMode::Fused;
  ShardedEmbeddingBagCollection sharded(tables, uniform_plan(tables, ShardingType::RowWise, 0),
                                        world(), nullptr, opts);
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
