// Checkpoint pieces of a ShardedEmbeddingBagCollection: its shards and their fused optimizer
// state, in GLOBAL table coordinates, so that a collection saved with one plan on N ranks loads
// into any other plan on any number of ranks (issue 8, "Checkpoints").
//
// Names in the checkpoint (fqn = "embedding_bags.<table>.weight", the collection's own FQN):
//   <model_prefix><fqn>                      [num_embeddings, embedding_dim], every shard placed at
//                                            its (row_offset, col_offset)
//   <optimizer_prefix>state.<fqn>.<field>    the fused optimizer's state (fused_optimizer.h):
//     per-element fields ([rows, cols]: Adam's momentum1/2, partial row-wise Adam's momentum1)
//       [num_embeddings, embedding_dim], placed like the weight
//     row-wise fields ([rows, 1]: row-wise Adagrad's momentum1, partial row-wise Adam's momentum2)
//       [num_embeddings], placed at the shard's row offset; BUT for a column_wise table, whose
//       column shards each keep their own row state (mean over the shard's columns),
//       [num_embeddings, K] with column shard k (in column order) in column k, and the split saved
//       as the value <optimizer_prefix>state.<fqn>.column_bounds = "0,c1,...,embedding_dim"
//   <optimizer_prefix>state.<fqn>.step       0-D int64, the table's step count (written once)
// data_parallel replicas (and the step of a table held by several ranks) are offered by every
// holder; the checkpoint writes a piece held by several ranks once.
//
// Loading row-wise state saved by one plan into another:
//   saved [N]    -> row_wise / table_wise / data_parallel / table_row_wise: exact (rows sliced)
//                -> column_wise: the column shards' own state is unknown; refused, unless
//                   EmbeddingLoadOptions::approximate_row_state (each shard starts from the whole
//                   row's value)
//   saved [N, K] -> column_wise with the same column bounds: exact
//                -> any non-column plan: the column-width-weighted mean sum_k m_k * w_k / dim,
//                   which is exactly the whole row's mean of squared gradients accumulated over the
//                   same gradients (row-wise Adagrad's state of an unsharded table)
//                -> column_wise with other bounds: refused (the message names both splits), unless
//                   approximate_row_state (every new shard starts from that weighted mean)
// Weights and per-element state load exactly into any plan.
//
// Use (collective only through checkpoint::save_checkpoint / load_checkpoint):
//   CheckpointState s; add_embedding_pieces(ebc, "model.", "optimizer.", s); save_checkpoint(...);
//   CheckpointState d; auto plan = embedding_load_template(ebc, read_index(dir / "index.h5"),
//                                                          "model.", "optimizer.", d);
//   load_checkpoint(dir, d, group);  apply_loaded_embeddings(ebc, plan, d);
// A rank that holds no shard of a table still asks for an empty piece of each of its tensors, so
// load_checkpoint's strict checks (missing, unexpected, shapes, dtypes) run on every rank; a table
// whose saved shape differs is refused by embedding_load_template naming it and both shapes.
//
// Managed-collision state (runtime/sparse/managed_collision.h, parallel/embedding/
// sharded_managed_collision.h): its modules give checkpoint-agnostic McStatePiece's (rows of
// global i64 arrays "<table>.row_ids" / "<table>.row_meta"); add_mc_pieces / mc_load_pieces below
// turn them into tensors "<prefix><piece name>" [num_embeddings] placed at their row offset, in
// the same CheckpointState as the tables (e.g. prefix "model.mc."), loadable at any world size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/index.h"
#include "checkpoint/state.h"
#include "parallel/embedding/sharded_embedding_bag_collection.h"
#include "runtime/sparse/managed_collision.h"

namespace mt::train {

// Appends this rank's pieces (see above) to `state`, and the column split values of the
// column_wise tables. The tensors alias the live weights and state: save before the next step.
void add_embedding_pieces(const parallel::ShardedEmbeddingBagCollection& ebc,
                          const std::string& model_prefix, const std::string& optimizer_prefix,
                          checkpoint::CheckpointState& state);

// Collective over ebc's group: the value <optimizer_prefix>kv_rows.<table> per kv-backed table,
// the rows its stores hold over every rank (every row ever trained; the others still have their
// initial values), which `mt_checkpoint inspect` prints. Call after add_embedding_pieces (which
// writes the caches back).
void add_kv_row_counts(const parallel::ShardedEmbeddingBagCollection& ebc,
                       const std::string& optimizer_prefix, checkpoint::CheckpointState& state);

struct EmbeddingLoadOptions {
  bool approximate_row_state = false;  // see "Loading row-wise state" above
};

// What embedding_load_template asked for, for apply_loaded_embeddings.
struct EmbeddingLoadPlan {
  enum class Kind { Weight, Element, Row, RowFromColumns, Step };
  struct Item {
    Kind kind = Kind::Weight;
    std::string table;
    std::string name;       // the tensor's name in the checkpoint (and in dest)
    std::string state_key;  // the optimizer state key ("<fqn>.<field>"); "" for weights
    int64_t rows = 0;       // the shard's rows
    std::vector<int64_t> saved_column_bounds;  // RowFromColumns: the saved split
  };
  std::vector<Item> items;
};

// Appends to `dest` the pieces this rank (under ebc's plan) reads from the checkpoint whose index
// is `saved`; errors name the table and what does not fit. Not collective.
EmbeddingLoadPlan embedding_load_template(const parallel::ShardedEmbeddingBagCollection& ebc,
                                          const checkpoint::Index& saved,
                                          const std::string& model_prefix,
                                          const std::string& optimizer_prefix,
                                          checkpoint::CheckpointState& dest,
                                          const EmbeddingLoadOptions& options = {});

// After load_checkpoint filled `dest`: copies the weights into the shards and loads the optimizer
// state (load_optimizer_state_dict). Items a caller erased from `plan`, or whose names start
// with one of `exclude` (pass LoadOptions::exclude, e.g. {"optimizer."} for a weights-only load),
// are left alone: their shards / state keep their current values. Not collective.
void apply_loaded_embeddings(parallel::ShardedEmbeddingBagCollection& ebc,
                             const EmbeddingLoadPlan& plan, const checkpoint::CheckpointState& dest,
                             const std::vector<std::string>& exclude = {});

// Managed-collision state pieces (from state()) as checkpoint tensors "<prefix><piece name>";
// empty pieces (a rank owning no buckets) are left out.
void add_mc_pieces(const std::vector<runtime::sparse::McStatePiece>& pieces,
                   const std::string& prefix, checkpoint::CheckpointState& state);

// Loading: appends to `dest` a piece for every piece of `mine` (this rank's current state(): the
// names and rows it owns; empty ones too, so every rank checks every saved tensor) and returns
// pieces whose tensors are those buffers: after load_checkpoint they hold the saved rows, ready
// for load_state(). A saved table of another size is refused by load_checkpoint, naming it.
std::vector<runtime::sparse::McStatePiece> mc_load_pieces(
    const std::vector<runtime::sparse::McStatePiece>& mine, const std::string& prefix,
    checkpoint::CheckpointState& dest);

}  // namespace mt::train
