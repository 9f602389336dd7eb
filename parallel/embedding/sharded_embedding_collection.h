// ShardedEmbeddingCollection: TorchRec's sharded EmbeddingCollection (sequence / unpooled
// embeddings). Built from the table configs, a ShardingPlan (sharding_plan.h) and a process
// group; each rank holds only its shards, and forward(local KJT of B samples) returns the same
// EmbeddingCollectionOutput (per feature, every id's row in the KJT's value order, with the KJT's
// lengths/offsets) that an unsharded runtime::sparse::EmbeddingCollection gives for those samples.
// Batch sizes may differ between ranks (0 included).
//
//   ShardedEmbeddingCollection ec(tables, plan, world);
//   ec.init_weights(seed);
//   EmbeddingCollectionOutput out = ec(local_kjt);   // collective
//   loss.backward();                                  // collective; Fused: rows updated here
//
// Parameters: "embeddings.<table>.weight", the rank's shard of the table (TorchRec's FQNs), drawn
// from the same (seed, FQN) stream over the global shape as the unsharded table, so a shard holds
// exactly the unsharded values. Ranks without a shard of a table (or with an empty block) have no
// parameter for it. local_shards() says where each one sits in the global table.
//
// Sharding types: data_parallel, table_wise, column_wise, row_wise, and table_row_wise. Unpooled
// rows need no reduction, so every sharded type is one pattern: an id goes to each shard that holds
// its row (table_wise: the owner; column_wise: every column shard's owner; row_wise /
// table_row_wise: its row block's owner, id made local), which returns the row's columns.
// table_row_wise is therefore row_wise over the node's ranks, exchanged over the whole group (no
// (node, local) mesh and no two-level exchange as TorchRec's TWRW; the plan's local_size only
// places the shards).
//
// Communication (world = the group; every call is made by every rank, in this order, also with
// empty batches, empty features and ranks that own nothing). No batch-size all-gather as the pooled
// collection's: the counts travel with the ids and the source keeps its own sample boundaries.
// - input dist: ONE lengths all-to-all, then ONE ids all-to-all (uneven splits, all_to_all_rows).
//   Rank r sends to owner j, per (feature, shard of j) pair (the same list on every rank, in table
//   order), the feature's ids that shard holds, in value order; the "lengths" are one count per
//   pair (unpooled lookups need no sample boundaries at the owner: the source keeps them).
// - lookups: data_parallel features on the local batch in one table-batched
//   embedding_lookup_batched call; every other owner looks up what it received in one call whose
//   "features" are the (source, pair) blocks, so its output is already in all-to-all order.
// - output dist: ONE all-to-all of the looked-up rows back to each id's source rank, where each row
//   (or column block) lands at the id's position (row_wise: one owner per id, no reduction;
//   column_wise: column shards side by side). The placement is an element index built on the host
//   (8 bytes per returned element, reused by backward): simple, not tuned for large batches.
// - backward mirrors it in one autograd node: the output gradient's rows are gathered per owner and
//   sent back in one all-to-all (always called, whatever the data); the owners' lookups then hand
//   the row-sparse gradients to their optimizer (below). data_parallel: the local row-sparse
//   gradient is summed over the replicas in one all-reduce (embedding_dist.h) and every replica
//   steps the same rows.
//
// Loss convention, gradient modes and column-wise optimizer state: as
// ShardedEmbeddingBagCollection (sharded_embedding_bag_collection.h): the tables get the gradient
// of the SUM of the ranks' losses; Fused updates rows inside backward (one optimizer per group:
// data_parallel, sharded), RowSparse keeps per-shard gradients for clipping and
// apply_sparse_grads(), Dense is refused; column shards keep row-wise optimizer state over their
// own columns (TorchRec's column_wise).
//
// Tables: f32 or f64; per-value weights are not used (EmbeddingCollection has none). The forward
// validates the input (lengths, ids against the global table sizes) before any collective. The
// module captures `this` in its backward: it must outlive its graphs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/embedding/sharded_embedding_bag_collection.h"  // LocalShard
#include "parallel/embedding/sharding_plan.h"
#include "runtime/nn/module.h"
#include "runtime/sparse/embedding_collection.h"
#include "runtime/sparse/keyed_jagged_tensor.h"
#include "runtime/sparse/table_collection.h"

namespace mt::parallel {

class ShardedEmbeddingCollection : public runtime::nn::Module {
 public:
  // Validates the plan against the tables and the group (every rank must construct it).
  ShardedEmbeddingCollection(std::vector<runtime::sparse::EmbeddingConfig> tables,
                             ShardingPlan plan, std::shared_ptr<ProcessGroup> group,
                             runtime::sparse::CollectionOptions options = {});
  ~ShardedEmbeddingCollection() override;

  // Collective. `features` holds this rank's samples; it must have every feature of the
  // collection (extra keys are ignored, any key order).
  runtime::sparse::EmbeddingCollectionOutput operator()(
      const runtime::sparse::KeyedJaggedTensor& features);

  const std::vector<runtime::sparse::EmbeddingConfig>& table_configs() const { return configs_; }
  const ShardingPlan& plan() const { return plan_; }
  const runtime::sparse::CollectionOptions& options() const { return options_; }
  ProcessGroup& group() const { return *group_; }
  // Features in output order (table by table, as the unsharded collection) and their dims.
  const std::vector<std::string>& feature_names() const { return feature_names_; }
  const std::vector<int64_t>& feature_dims() const { return feature_dims_; }

  // The shards this rank holds (non-empty ones), in table order; fqn "embeddings.<table>.weight".
  std::vector<LocalShard> local_shards() const;

  // The fused row optimizers' state of this rank's shards, keyed "<weight fqn>.momentum1",
  // ".momentum2", ".step" (local rows of the shard).
  runtime::nn::StateDict optimizer_state_dict() const;
  void load_optimizer_state_dict(const runtime::nn::StateDict& state);
  void set_lr(double lr);

  // GradientMode::RowSparse: gradients in the shard's local rows.
  std::vector<ShardedEmbeddingBagCollection::ShardGrad> sparse_grads() const;
  // sum |g|^p over this rank's kept gradients (max for p = inf), data_parallel tables on rank 0
  // only: all-reduce it with the dense partials for the total norm.
  double sparse_grad_norm_pow(double norm_type = 2.0) const;
  void scale_sparse_grads_(double coef);
  // One optimizer step of every group with the kept gradients, then drops them.
  void apply_sparse_grads();
  void zero_sparse_grads();

 private:
  struct Group;  // data_parallel or sharded: its tables, lookup layout, optimizer, kept grads
  struct Plan;   // the exchange plan all ranks derive from the sharding plan

  void build();
  runtime::sparse::EmbeddingCollectionOutput forward(const runtime::sparse::KeyedJaggedTensor& kjt);
  runtime::TableGradSink make_sink(int group);

  std::vector<runtime::sparse::EmbeddingConfig> configs_;
  ShardingPlan plan_;
  std::shared_ptr<ProcessGroup> group_;
  runtime::sparse::CollectionOptions options_;
  std::vector<std::string> feature_names_;
  std::vector<int64_t> feature_dims_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::unique_ptr<Plan> xplan_;
  runtime::Tensor anchor_;  // a leaf so the output node is recorded on every rank
};

}  // namespace mt::parallel
