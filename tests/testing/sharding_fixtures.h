// Pieces the sharded-embedding tests share: one sharding type for every table of a test, the
// tables' feature names, and the counter-based mixer their random ids are drawn from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/embedding/sharding_plan.h"

namespace mt::testing {

// Every table sharded as `type` over `world_size` ranks (`local_size` ranks per node; the plan's
// local_size): table i owned by rank i % world_size (table_wise), column shards on 2-3 distinct
// ranks not in rank order (column_wise), rows over all ranks (row_wise) or over node
// i % (world_size / local_size) (table_row_wise), replicated (data_parallel).
parallel::ShardingPlan uniform_sharding_plan(
    const std::vector<parallel::EmbeddingBagConfig>& tables, parallel::ShardingType type,
    int world_size, int local_size);

// Every table's feature names, table by table.
std::vector<std::string> all_feature_names(const std::vector<parallel::EmbeddingBagConfig>& tables);

// SplitMix64's finaliser: a well-mixed 64-bit value of x (deterministic test data).
uint64_t mix64(uint64_t x);

}  // namespace mt::testing
