// The embedding sharding planner (TorchRec's EmbeddingShardingPlanner, greedy): picks a sharding
// type and a placement for every table from its memory (weights + fused optimizer state,
// sharding_plan.h's shard_bytes) and an estimate of the bytes it moves per step, under a per-rank
// memory budget and optional per-table constraints.
//
//   PlannerOptions opts{.world_size = 4, .memory_budget_bytes = 64 << 20};
//   opts.constraints["t_user"] = {.allowed = {ShardingType::RowWise}};
//   ShardingPlan plan = plan_sharding(tables, opts);
//   std::cout << plan.describe(tables);
//
// The rules (each table's choice and the reason are recorded in ParameterSharding::reason):
// 1. Tables are placed largest first (bytes), so the big ones are spread before the small ones
//    fill the gaps (longest-processing-time bin packing).
// 2. "tiny" tables go data_parallel: replicated, no input or output exchange, but a gradient
//    all-reduce of the whole table every step. A table is tiny when that all-reduce
//    (~2 x its weight bytes) moves fewer bytes than the table_wise exchange of a step would
//    (ids in, pooled rows out and their gradients back:
//    world * batch_size_per_rank * features * (8 * (pooling_factor + 1) + 2 * dim * elem)), and its
//    bytes are at most data_parallel_max_fraction of the budget (it is paid on every rank).
// 3. "big" tables (bytes > row_wise_min_fraction of the budget) go row_wise, or table_row_wise
//    when the job spans several nodes (local_size < world_size): rows spread over the ranks, so
//    no rank holds the whole table and the lookups are spread too; table_row_wise keeps the
//    pooled partial sums' reduction inside a node (the fast links) and sends one block per node.
// 4. The others go table_wise, onto the rank with the fewest bytes so far (ties: lowest rank):
//    the cheapest exchange for a table that fits a rank comfortably.
// 5. When the preferred type does not fit (or is not allowed), the next one is tried, in the order
//    table_wise, column_wise (2, 3, ... shards on the least loaded ranks), row_wise,
//    table_row_wise, data_parallel; the first placement that keeps every rank within the budget
//    wins. When none fits, plan_sharding throws naming the table, its bytes, the budget and the
//    bytes already placed per rank.
// Constraints restrict the types tried for a table (`allowed`), or fix one (`type`).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "parallel/embedding/sharding_plan.h"

namespace mt::parallel {

struct PlannerTableConstraint {
  std::optional<ShardingType> type;   // fixed type (must fit, or planning fails)
  std::vector<ShardingType> allowed;  // types the planner may choose from (empty: any)
};

struct PlannerOptions {
  int world_size = 1;
  int local_size = 0;                          // ranks per node, for table_row_wise (0: world_size)
  int64_t memory_budget_bytes = 0;             // per rank: weights + optimizer state
  runtime::DType dtype = runtime::DType::F32;  // table dtype
  std::map<std::string, PlannerTableConstraint> constraints;  // by table name
  // Traffic model of rule 2.
  int64_t batch_size_per_rank = 512;
  double pooling_factor = 1.0;  // mean ids per bag
  double data_parallel_max_fraction = 0.05;
  double row_wise_min_fraction = 0.25;
};

// See above. Throws mt::Error for bad options, unknown constrained tables, and when a table does
// not fit.
ShardingPlan plan_sharding(const std::vector<EmbeddingBagConfig>& tables,
                           const PlannerOptions& options);

}  // namespace mt::parallel
