// Internal to the embedding checkpoint (embedding_checkpoint.cpp and
// embedding_checkpoint_raw_ids.cpp): the fused optimizer's state fields as checkpointed, the
// streamed pieces' chunk size, and the raw-id tables' pieces. Not for other users.
//
// Raw-id kv tables (EmbeddingBagConfig::raw_ids) are saved SPARSE: only the rows their stores
// hold, each rank's run sorted by id, the ranks' runs concatenated (N rows in all):
//   <model_prefix>embedding_bags.<t>.ids       [N] int64, the rows' ids
//   <model_prefix>embedding_bags.<t>.weight    [N, embedding_dim]
//   <optimizer_prefix>state.<fqn>.<field>      [N, embedding_dim] or [N] (row-wise fields)
//   <optimizer_prefix>state.<fqn>.raw_id_rows  the value N
// Loading: every rank holding a shard of the table reads all N rows in chunks and keeps the ids
// its shard owns (raw_id_owner), so any rank count and plan loads them. A dense checkpoint of the
// table (a memory or row-keyed kv table's [M, dim], no ids) loads into a raw-id table as ids
// 0..M-1; a raw-id checkpoint does not load into a row-keyed table (refused, naming it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/index.h"
#include "checkpoint/state.h"
#include "parallel/embedding/sharded_embedding_bag_collection.h"

namespace mt::train::embedding_checkpoint {

struct Field {
  std::string name;
  bool row_wise;  // [rows, 1] (else [rows, cols])
};

// The state a table keeps: its optimizer's fields; none when it does not train (frozen).
std::vector<Field> fields_of(const parallel::EmbeddingBagConfig& c);

// Rows per streamed piece of a kv table (4 MiB of f32 weights at dim 16).
constexpr int64_t kKvChunkRows = int64_t(1) << 16;

// The kv shard's state field index of `name`.
int kv_field(const runtime::sparse::KvTable& kv, const std::string& name);

std::string weight_fqn(const std::string& table);  // "embedding_bags.<table>.weight"
std::string ids_fqn(const std::string& table);     // "embedding_bags.<table>.ids"

// Saving: the pieces of every raw-id table this rank holds, and the raw_id_rows values.
// Collective over ebc's group when it has raw-id tables (one all-gather of the row counts).
// Call after flush_kv().
void add_raw_id_pieces(const parallel::ShardedEmbeddingBagCollection& ebc,
                       const std::string& model_prefix, const std::string& optimizer_prefix,
                       checkpoint::CheckpointState& state);

// Loading raw-id table `c` (this rank's shard of it, or null) of the collection's `dtype`: empties
// the shard and appends the pieces that refill it to `dest` (empty ones on a rank without a
// shard). Not collective.
void add_raw_id_load_pieces(const parallel::EmbeddingBagConfig& c, runtime::DType dtype,
                            const parallel::LocalShard* shard,
                            const checkpoint::Index& saved, const std::string& model_prefix,
                            const std::string& optimizer_prefix, checkpoint::CheckpointState& dest);

}  // namespace mt::train::embedding_checkpoint
