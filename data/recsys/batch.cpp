#include "data/recsys/batch.h"

#include "runtime/core/error.h"

namespace mt::data::recsys {

std::vector<int64_t> rank_rows(int64_t global_size, int64_t rank, int64_t world_size) {
  MT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "recsys: rank ", rank,
           " is not in [0, world_size = ", world_size, ")");
  std::vector<int64_t> rows;
  for (int64_t p = rank; p < global_size; p += world_size) rows.push_back(p);
  return rows;
}

}  // namespace mt::data::recsys
