// Placements: how a tensor is laid out over one dimension of a DeviceMesh (torch's DTensor names).
//
// - Shard{dim}: the tensor is split along `dim` into mesh-dim-size chunks of ceil(size/n) rows
//   (torch.chunk semantics): chunk i covers [i*c, min((i+1)*c, size)); trailing chunks may be
//   short or empty. Locally each rank stores its chunk padded to c rows where a flat buffer needs
//   equal sizes (FSDP), and reads only the valid part.
// - Replicate: every rank of the mesh dim holds the whole tensor.
// - Partial{op}: every rank holds a partial value; the tensor is their reduction (e.g. sum).
// - StridedShard{dim, split_factor}: a Shard applied out of mesh order (torch's _StridedShard).
//   It appears when a tensor dim is sharded by an inner mesh dim first and an outer one second:
//   FSDP over dp_shard sharding dim 0 of a weight that tensor parallelism (the inner tp dim)
//   already split on dim 0. Pieces are cut in this order: every plain Shard in mesh order, then
//   every StridedShard in mesh order, each chunking what the earlier cuts left; split_factor is
//   the number of pieces the later mesh dims cut that tensor dim into first (tp above), checked
//   when a piece is placed. Each rank's piece stays one contiguous box of the whole tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "parallel/comm/process_group.h"

namespace mt::parallel {

struct Shard {
  int64_t dim = 0;
  bool operator==(const Shard&) const = default;
};
struct Replicate {
  bool operator==(const Replicate&) const = default;
};
struct Partial {
  ReduceOp op = ReduceOp::Sum;
  bool operator==(const Partial&) const = default;
};
struct StridedShard {
  int64_t dim = 0;
  int64_t split_factor = 1;
  bool operator==(const StridedShard&) const = default;
};
using Placement = std::variant<Shard, Replicate, Partial, StridedShard>;

// "Shard(0)", "Replicate()", "Partial(sum)", "StridedShard(0, sf=2)"
std::string placement_name(const Placement& p);
std::string placements_name(const std::vector<Placement>& placements);  // "[Shard(0), Replicate()]"
// The tensor dim a Shard or StridedShard splits; nullopt for Replicate and Partial.
std::optional<int64_t> sharded_dim(const Placement& p);
inline bool is_replicate(const Placement& p) { return std::holds_alternative<Replicate>(p); }
inline bool is_partial(const Placement& p) { return std::holds_alternative<Partial>(p); }

// Chunk `index` of `size` rows split into `num_chunks` torch.chunk-style pieces.
struct ChunkRange {
  int64_t padded_length = 0;  // ceil(size / num_chunks): every chunk's padded length
  int64_t offset = 0;         // first row of this chunk (clamped to size)
  int64_t length = 0;         // valid rows of this chunk (0 for trailing empty chunks)
};
ChunkRange chunk_range(int64_t size, int64_t num_chunks, int64_t index);

}  // namespace mt::parallel
