// Placement names and torch.chunk-style ranges.
#include "parallel/mesh/placement.h"

#include <algorithm>

#include "runtime/core/error.h"

namespace mt::parallel {

std::string placement_name(const Placement& p) {
  if (const auto* s = std::get_if<Shard>(&p)) return detail::concat("Shard(", s->dim, ")");
  if (std::holds_alternative<Replicate>(p)) return "Replicate()";
  if (const auto* s = std::get_if<StridedShard>(&p))
    return detail::concat("StridedShard(", s->dim, ", sf=", s->split_factor, ")");
  return detail::concat("Partial(", reduce_op_name(std::get<Partial>(p).op), ")");
}

std::string placements_name(const std::vector<Placement>& placements) {
  std::string out = "[";
  for (size_t i = 0; i < placements.size(); ++i)
    out += (i ? ", " : "") + placement_name(placements[i]);
  return out + "]";
}

std::optional<int64_t> sharded_dim(const Placement& p) {
  if (const auto* s = std::get_if<Shard>(&p)) return s->dim;
  if (const auto* s = std::get_if<StridedShard>(&p)) return s->dim;
  return std::nullopt;
}

ChunkRange chunk_range(int64_t size, int64_t num_chunks, int64_t index) {
  MT_CHECK(size >= 0 && num_chunks >= 1 && index >= 0 && index < num_chunks,
           "chunk_range: expected size >= 0 and 0 <= index < num_chunks, got size ", size,
           ", num_chunks ", num_chunks, ", index ", index);
  ChunkRange r;
  r.padded_length = (size + num_chunks - 1) / num_chunks;
  r.offset = std::min(size, index * r.padded_length);
  r.length = std::min(size, r.offset + r.padded_length) - r.offset;
  return r;
}

}  // namespace mt::parallel
