// The embedding sharding planner and plan: type choice by size, balanced table_wise placement,
// constraints, budgets, the refusal message, plan validation and describe().
#include "parallel/embedding/planner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/core/error.h"

namespace mt::parallel {
namespace {

EmbeddingBagConfig table(const std::string& name, int64_t rows, int64_t dim) {
  EmbeddingBagConfig t;
  t.name = name;
  t.num_embeddings = rows;
  t.embedding_dim = dim;
  t.feature_names = {"f_" + name};
  return t;  // row-wise Adagrad: rows * dim * 4 + rows * 4 bytes
}

int64_t bytes(const EmbeddingBagConfig& t) {
  return shard_bytes(t, t.num_embeddings, t.embedding_dim);
}

TEST(ShardBytes, CountsWeightsAndOptimizerState) {
  EmbeddingBagConfig t = table("t", 100, 8);
  EXPECT_EQ(shard_bytes(t, 100, 8), 100 * 8 * 4 + 100 * 4);
  t.optimizer.type = runtime::sparse::EmbOptimType::Adam;
  EXPECT_EQ(shard_bytes(t, 100, 8), 3 * 100 * 8 * 4);
  t.optimizer.type = runtime::sparse::EmbOptimType::PartialRowwiseAdam;
  EXPECT_EQ(shard_bytes(t, 100, 8), 2 * 100 * 8 * 4 + 100 * 4);
  t.optimizer.type = runtime::sparse::EmbOptimType::SGD;
  EXPECT_EQ(shard_bytes(t, 100, 8, runtime::DType::F64), 100 * 8 * 8);
}

TEST(Planner, BigRowWiseSmallTableWiseTinyDataParallel) {
  const std::vector<EmbeddingBagConfig> tables = {
      table("big", 100000, 32),  // ~13 MB: > 25% of 16 MB
      table("mid_a", 8000, 32), table("mid_b", 6000, 32), table("mid_c", 5000, 32),
      table("tiny", 10, 4)};
  PlannerOptions o;
  o.world_size = 4;
  o.memory_budget_bytes = 16 << 20;
  const ShardingPlan plan = plan_sharding(tables, o);
  EXPECT_EQ(plan.at("big").type, ShardingType::RowWise);
  EXPECT_EQ(plan.at("tiny").type, ShardingType::DataParallel);
  for (const char* m : {"mid_a", "mid_b", "mid_c"})
    EXPECT_EQ(plan.at(m).type, ShardingType::TableWise) << m;
  // Largest first onto the least loaded rank: all on different ranks.
  EXPECT_NE(plan.at("mid_a").ranks[0], plan.at("mid_b").ranks[0]);
  EXPECT_NE(plan.at("mid_b").ranks[0], plan.at("mid_c").ranks[0]);
  EXPECT_NE(plan.at("mid_a").ranks[0], plan.at("mid_c").ranks[0]);
  // Row blocks of ceil(100000 / 4).
  const ParameterSharding& big = plan.at("big");
  ASSERT_EQ(big.shards.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(big.shards[size_t(r)].rank, r);
    EXPECT_EQ(big.shards[size_t(r)].row_offset, 25000 * r);
    EXPECT_EQ(big.shards[size_t(r)].num_rows, 25000);
    EXPECT_EQ(big.shards[size_t(r)].num_cols, 32);
  }
  EXPECT_FALSE(big.reason.empty());
  const std::vector<int64_t> per_rank = plan.bytes_per_rank(tables);
  int64_t total = 0;
  for (int64_t b : per_rank) {
    EXPECT_LE(b, o.memory_budget_bytes);
    total += b;
  }
  EXPECT_EQ(total, bytes(tables[0]) + bytes(tables[1]) + bytes(tables[2]) + bytes(tables[3]) +
                       4 * bytes(tables[4]));
  const std::string text = plan.describe(tables);
  for (const char* s : {"big [100000 x 32]", "row_wise", "table_wise", "data_parallel",
                        "25000x32 @25000,0", "total per rank", "r3"})
    EXPECT_NE(text.find(s), std::string::npos) << s << " in\n" << text;
}

TEST(Planner, TableWiseBalancesBytes) {
  std::vector<EmbeddingBagConfig> tables;
  for (int i = 0; i < 6; ++i) {
    std::string name = "t";
    name += std::to_string(i);
    tables.push_back(table(name, 1000 * (i + 1), 16));
  }
  PlannerOptions o;
  o.world_size = 3;
  o.memory_budget_bytes = 1 << 30;
  o.data_parallel_max_fraction = 0;  // nothing replicated
  const ShardingPlan plan = plan_sharding(tables, o);
  for (const auto& t : tables) EXPECT_EQ(plan.at(t.name).type, ShardingType::TableWise);
  // LPT on 6000, 5000, ..., 1000 rows over 3 ranks: {6,1}, {5,2}, {4,3} thousand rows.
  const std::vector<int64_t> per_rank = plan.bytes_per_rank(tables);
  EXPECT_EQ(per_rank[0], per_rank[1]);
  EXPECT_EQ(per_rank[1], per_rank[2]);
}

TEST(Planner, MultiNodeBigTablesGoTableRowWise) {
  const std::vector<EmbeddingBagConfig> tables = {table("big", 40000, 16), table("small", 500, 16)};
  PlannerOptions o;
  o.world_size = 4;
  o.local_size = 2;
  o.memory_budget_bytes = 4 << 20;
  o.data_parallel_max_fraction = 0;
  const ShardingPlan plan = plan_sharding(tables, o);
  const ParameterSharding& big = plan.at("big");
  EXPECT_EQ(big.type, ShardingType::TableRowWise);
  ASSERT_EQ(big.ranks.size(), 2u);
  EXPECT_EQ(big.ranks[1], big.ranks[0] + 1);
  EXPECT_EQ(big.ranks[0] % 2, 0);
  EXPECT_EQ(big.shards[1].row_offset, 20000);
  // The small table goes to the other node (its ranks are empty).
  EXPECT_EQ(plan.at("small").type, ShardingType::TableWise);
  EXPECT_NE(plan.at("small").ranks[0] / 2, big.ranks[0] / 2);
}

TEST(Planner, FallsBackWhenTheFirstChoiceDoesNotFit) {
  // Not "big" (< 25% of the budget as a fraction rule is disabled), but table_wise does not fit
  // any rank once the others are filled: column_wise over 2 ranks does.
  const std::vector<EmbeddingBagConfig> tables = {table("a", 1000, 64), table("b", 1000, 64),
                                                  table("c", 1000, 64)};
  const int64_t one = bytes(tables[0]);
  PlannerOptions o;
  o.world_size = 2;
  o.memory_budget_bytes = one + one / 2 + 4096;
  o.row_wise_min_fraction = 1.0;
  o.data_parallel_max_fraction = 0;
  o.constraints["c"].allowed = {ShardingType::TableWise, ShardingType::ColumnWise};
  const ShardingPlan plan = plan_sharding(tables, o);
  EXPECT_EQ(plan.at("a").type, ShardingType::TableWise);
  EXPECT_EQ(plan.at("b").type, ShardingType::TableWise);
  EXPECT_EQ(plan.at("c").type, ShardingType::ColumnWise);
  EXPECT_EQ(plan.at("c").shards.size(), 2u);
  EXPECT_EQ(plan.at("c").shards[1].col_offset, 32);
  EXPECT_NE(plan.at("c").reason.find("did not fit"), std::string::npos) << plan.at("c").reason;
}

TEST(Planner, ConstraintsFixAndRestrictTypes) {
  const std::vector<EmbeddingBagConfig> tables = {table("a", 100, 8), table("b", 100000, 8),
                                                  table("c", 2000, 8)};
  PlannerOptions o;
  o.world_size = 2;
  o.memory_budget_bytes = 64 << 20;
  o.constraints["a"].type = ShardingType::ColumnWise;
  o.constraints["b"].allowed = {ShardingType::TableWise};
  o.constraints["c"].type = ShardingType::DataParallel;
  const ShardingPlan plan = plan_sharding(tables, o);
  EXPECT_EQ(plan.at("a").type, ShardingType::ColumnWise);
  EXPECT_EQ(plan.at("a").reason, "fixed by constraint");
  EXPECT_EQ(plan.at("b").type, ShardingType::TableWise);
  EXPECT_EQ(plan.at("c").type, ShardingType::DataParallel);
  EXPECT_EQ(plan.at("c").ranks, (std::vector<int>{0, 1}));
}

TEST(Planner, RefusesWithTableBytesAndBudget) {
  const std::vector<EmbeddingBagConfig> tables = {table("small", 100, 8),
                                                  table("huge", 1000000, 64)};
  PlannerOptions o;
  o.world_size = 2;
  o.memory_budget_bytes = 1 << 20;
  try {
    plan_sharding(tables, o);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& s :
         {std::string("'huge'"), std::to_string(bytes(tables[1])), std::string("1048576"),
          std::string("budget"), std::string("row_wise"), std::string("r1")})
      EXPECT_NE(msg.find(s), std::string::npos) << s << " in: " << msg;
  }
  // A fixed type that cannot fit is refused too, naming the constraint.
  o.memory_budget_bytes = 64 << 20;
  o.constraints["huge"].type = ShardingType::TableWise;
  try {
    plan_sharding(tables, o);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fits no allowed sharding (tried: table_wise)"),
              std::string::npos)
        << e.what();
  }
  // Unknown constrained tables and bad options.
  o.constraints.clear();
  o.constraints["nope"].type = ShardingType::RowWise;
  EXPECT_THROW(plan_sharding(tables, o), Error);
  o.constraints.clear();
  o.local_size = 3;
  EXPECT_THROW(plan_sharding(tables, o), Error);
}

TEST(ShardingPlan, ValidateNamesTheProblem) {
  const std::vector<EmbeddingBagConfig> tables = {table("a", 10, 8), table("b", 10, 8)};
  ShardingPlan plan;
  plan.world_size = 2;
  plan.tables["a"] = row_wise_sharding(tables[0], 2);
  auto expect_error = [&](const std::string& needle) {
    try {
      plan.validate(tables);
      FAIL() << "expected an error with " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("no entry for table 'b'");
  plan.tables["b"] = column_wise_sharding(tables[1], {1, 1});
  expect_error("distinct ranks");
  plan.tables["b"] = column_wise_sharding(tables[1], {1, 0});
  plan.validate(tables);
  plan.tables["a"].shards[1].row_offset = 4;
  expect_error("starts at row 4");
  plan.tables["a"] = table_wise_sharding(tables[0], 2);
  expect_error("world size 2");
  plan.tables["a"] = table_wise_sharding(tables[0], 0);
  plan.tables["c"] = table_wise_sharding(tables[0], 0);
  expect_error("'c' is planned but");
  EXPECT_EQ(parse_sharding_type("Row_Wise"), ShardingType::RowWise);
  EXPECT_THROW(parse_sharding_type("diagonal"), Error);
}

}  // namespace
}  // namespace mt::parallel
