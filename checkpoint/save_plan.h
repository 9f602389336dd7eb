// Save planning: which rank writes which chunk. Every rank describes the pieces it holds
// (ChunkMeta), the descriptions are all-gathered, and every rank computes the same plan from
// them, so no plan has to be sent around.
//
// - A chunk is identified by (fqn, global offset, shape); ranks holding the same one (replicated
//   tensors, HSDP shards) write it once: the holder with the fewest bytes assigned so far (chunks
//   only one rank holds are assigned first, the shared ones then largest first).
// - The plan checks the pieces of each tensor: one dtype and global shape on every rank, chunks
//   inside the tensor, no partial overlaps, and every element covered; errors name the tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"

namespace mt::checkpoint {

struct ChunkMeta {
  std::string fqn;
  runtime::DType dtype = runtime::DType::F32;
  runtime::Shape global_shape;
  runtime::Shape offset;
  runtime::Shape sizes;
  int64_t bytes() const;
};

// A line-based text form for the all-gather (fqns must not contain tabs or newlines).
std::string encode_chunks(const std::vector<ChunkMeta>& chunks);
std::vector<ChunkMeta> decode_chunks(const std::string& text);

struct PlannedChunk {
  ChunkMeta meta;
  int writer = 0;       // the rank that writes it
  int local_index = 0;  // its index in the writer's own list
};

struct SavePlan {
  std::vector<PlannedChunk> chunks;  // every distinct chunk, sorted by fqn then offset
  // Per rank, the indices (into that rank's own list) of the chunks it writes.
  std::vector<std::vector<int>> writes;
};

SavePlan plan_save(const std::vector<std::vector<ChunkMeta>>& per_rank);

// The rank file name of a rank ("rank-00003.h5") and a chunk's dataset path in it.
std::string rank_file_name(int rank);
std::string chunk_dataset_path(const std::string& fqn);

}  // namespace mt::checkpoint
