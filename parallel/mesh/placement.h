// Placements: how a tensor is laid out over one dimension of a DeviceMesh (torch's DTensor names).
//
// - Shard{dim}: the tensor is split along `dim` into mesh-dim-size chunks of ceil(size/n) rows
//   (torch.chunk semantics): chunk i covers [i*c, min((i+1)*c, size)); trailing chunks may be
//   short or empty. Locally each rank stores its chunk padded to c rows where a flat buffer needs
//   equal sizes (FSDP), and reads only the valid part.
// - Replicate: every rank of the mesh dim holds the whole tensor.
// - Partial{op}: every rank holds a partial value; the tensor is their reduction (e.g. sum).
#pragma once

#include <cstdint>
#include <string>
#include <variant>

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
using Placement = std::variant<Shard, Replicate, Partial>;

std::string placement_name(const Placement& p);  // "Shard(0)", "Replicate()", "Partial(sum)"

// Chunk `index` of `size` rows split into `num_chunks` torch.chunk-style pieces.
struct ChunkRange {
  int64_t padded_length = 0;  // ceil(size / num_chunks): every chunk's padded length
  int64_t offset = 0;         // first row of this chunk (clamped to size)
  int64_t length = 0;         // valid rows of this chunk (0 for trailing empty chunks)
};
ChunkRange chunk_range(int64_t size, int64_t num_chunks, int64_t index);

}  // namespace mt::parallel
