// Sharded-embedding test pieces (see sharding_fixtures.h).
#include "tests/testing/sharding_fixtures.h"

#include <algorithm>

namespace mt::testing {

using parallel::EmbeddingBagConfig;
using parallel::ShardingPlan;
using parallel::ShardingType;

ShardingPlan uniform_sharding_plan(const std::vector<EmbeddingBagConfig>& tables, ShardingType type,
                                   int world_size, int local_size) {
  const int W = world_size;
  ShardingPlan plan;
  plan.world_size = W;
  plan.local_size = local_size;
  for (size_t i = 0; i < tables.size(); ++i) {
    const EmbeddingBagConfig& t = tables[i];
    const int owner = int(i) % W;
    switch (type) {
      case ShardingType::DataParallel:
        plan.tables[t.name] = parallel::data_parallel_sharding(t, W);
        break;
      case ShardingType::TableWise:
        plan.tables[t.name] = parallel::table_wise_sharding(t, owner);
        break;
      case ShardingType::ColumnWise: {
        std::vector<int> ranks;  // 2 or 3 shards on distinct ranks, not in rank order
        const int n = std::min<int>(W, int(std::min<int64_t>(3, t.embedding_dim)));
        for (int k = 0; k < n; ++k) ranks.push_back((owner + W - k) % W);
        plan.tables[t.name] = parallel::column_wise_sharding(t, ranks);
        break;
      }
      case ShardingType::RowWise:
        plan.tables[t.name] = parallel::row_wise_sharding(t, W);
        break;
      case ShardingType::TableRowWise:
        plan.tables[t.name] =
            parallel::table_row_wise_sharding(t, int(i) % (W / local_size), local_size);
        break;
    }
  }
  return plan;
}

std::vector<std::string> all_feature_names(const std::vector<EmbeddingBagConfig>& tables) {
  std::vector<std::string> f;
  for (const auto& t : tables) f.insert(f.end(), t.feature_names.begin(), t.feature_names.end());
  return f;
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace mt::testing
