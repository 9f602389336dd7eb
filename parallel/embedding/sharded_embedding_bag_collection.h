// ShardedEmbeddingBagCollection: TorchRec's sharded EmbeddingBagCollection. Built from the table
// configs, a ShardingPlan (sharding_plan.h, e.g. from plan_sharding) and a process group; each rank
// holds only its shards, and forward(local KJT of B samples) returns the same KeyedTensor
// [B, sum of the features' dims] that an unsharded runtime::sparse::EmbeddingBagCollection gives
// for those samples. Batch sizes may differ between ranks (0 included).
//
//   ShardedEmbeddingBagCollection ebc(tables, plan, world);       // + a (node, local) mesh for
//   ebc.init_weights(seed);                                       //   table_row_wise tables
//   KeyedTensor out = ebc(local_kjt);   // collective
//   loss.backward();                    // collective; Fused: touched rows updated here
//
// Parameters: "embedding_bags.<table>.weight", the rank's shard of the table (TorchRec's FQNs),
// drawn from the same (seed, FQN) stream over the global shape as the unsharded table, so a shard
// holds exactly the unsharded values. Ranks without a shard of a table (or with an empty row
// block) have no parameter for it. local_shards() says where each one sits in the global table.
//
// Communication (world = the group; B_r = rank r's batch, G = sum of B_r; every call is made by
// every rank, in this order, also with empty batches, empty features and ranks that own no rows):
// - batch sizes: one all-gather of B_r.
// - input dist: ONE lengths all-to-all, then ONE values all-to-all (and one per-sample-weights
//   all-to-all when weighted), uneven splits (all_to_all_rows). Rank r sends to rank j, per
//   feature j needs, B_r lengths and their ids: table_wise / column_wise shards owned by j (every
//   id; a column-wise feature goes to every column shard's owner), then row_wise features
//   (only ids in j's row block, made local), then table_row_wise features of j's node (ids in j's
//   block). Each owner sees its features for all G samples, in source-rank order.
// - lookups: one table-batched embedding_bags_batched call per sharding group (data_parallel on
//   the local batch; table_wise + column_wise; row_wise; table_row_wise), over all its tables.
// - output dist:
//   data_parallel   none (local lookup; the gradient is all-reduced, see below)
//   table_wise /    pooled rows all-to-all back to their sample's rank (one all-to-all of the
//   column_wise     owners' blocks); column shards land in their columns of the table's output
//   row_wise        partial sums of every owner reduce-scattered (sum) to the sample's rank
//                   (padded to the largest B_r when batches differ)
//   table_row_wise  reduce-scatter inside the node (the mesh's dim 1, "local"), then an all-to-all
//                   across nodes (dim 0, "node") of each node's tables' rows: TorchRec's TWRW
//   MEAN tables of row_wise / table_row_wise are pooled as SUM and divided by the bag lengths
//   (known at the source) after the reduction; an empty bag gives 0, as unsharded.
// - backward mirrors it: all-to-all back (table_wise / column_wise), all-gather of the output
//   gradient (row_wise; table_row_wise: all-to-all across nodes, all-gather inside the node).
//   The output exchange and its backward are one autograd node, so the backward collectives run
//   in one fixed order on every rank whatever the data.
// - data_parallel gradients: the row-sparse gradient of the local batch is densified into one
//   flat buffer with a touched-row count per row (all data_parallel tables together) and
//   all-reduced (sum), then the touched rows step on every replica alike. Fine for the small
//   tables the planner replicates; a big replicated table would move its full size every step.
//   (embedding_dist.h, shared with the unpooled ShardedEmbeddingCollection.)
//
// Loss convention: each rank backpropagates the loss of its own samples and the tables get the
// gradient of the SUM of the ranks' losses (every type alike, data_parallel too: its all-reduce
// sums), i.e. exactly the single-process run over the global batch. A training loop whose dense
// gradients are averaged over ranks (FSDP's reduce-scatter mean) should scale the loss it
// backpropagates, or the tables' learning rates, by 1 / world to match (TorchRec leaves the same
// choice to the user: its data_parallel tables average through DDP, its sharded ones sum).
//
// Gradient modes (CollectionOptions::gradient_mode):
//   Fused      the rows touched by the batch are updated inside backward by the tables' fused row
//              optimizers (runtime/sparse/fused_optimizer.h), one optimizer per sharding group;
//              nothing is kept, and the tables are left out of clipping (as TorchRec does).
//   RowSparse  backward keeps a row-sparse gradient per local shard (in local rows); the training
//              loop adds sparse_grad_norm_pow() to its clipping partial (data_parallel tables
//              counted on rank 0 only, so each shard counts once after the all-reduce), scales
//              with scale_sparse_grads_(), and calls apply_sparse_grads().
//   Dense      not supported (throws): shards are stepped by their row optimizers.
// Kv tables (EmbeddingBagConfig::storage = Kv; runtime/sparse/kv/kv_table.h): each shard keeps
// its rows and their optimizer state in this rank's RocksDB store (options.kv.path/rank-<r>,
// wiped at construction) behind a row cache. A lookup first gathers the shard's working set (the
// sorted unique rows its ids touch) and turns the ids into positions in it, in the same order, so
// the lookup and the fused optimizer compute bitwise what an in-memory shard computes; after the
// optimizer step (inside backward, or apply_sparse_grads) the rows go back to the cache. One
// forward per step (no accumulation over batches with kv tables). prefetch(next batch) routes the
// next ids (collective) and reads their rows in the background. Kv shards are not parameters
// (LocalShard::kv instead of weight); not data_parallel. On a GPU each shard's cache is in device
// memory: a step's cached rows are gathered there, only misses are uploaded and evictions
// downloaded (kv_table.h). In RowSparse mode their kept gradients' rows are working-set
// positions.
// Raw-id kv tables (EmbeddingBagConfig::raw_ids): ids are any 64-bit keys >= 0, not rows; the
// input dist sends a row_wise / table_row_wise table's ids to shard raw_id_owner(id, shards) of
// its plan (a hash, ids unchanged) instead of by row block; table_wise sends them all to the
// owner; column_wise is refused. A plan's row blocks then only size the shards' caches.
// Update modes (EmbeddingBagConfig::update): frozen tables drop their gradients and keep no
// optimizer state; writeback tables take the gradient reaching a row as its new value;
// update_features: the other features of a shared table read it through a read-only alias.
// set_row_update_listener hears of every changed row (global ids, new values) after each step.
// Column-wise shards keep row-wise optimizer state over their own columns (row-wise Adagrad's
// mean of squares is per shard), as TorchRec's column_wise sharding does: such a table's Adagrad
// updates match an unsharded table split into those column shards, not one unsharded table.
//
// Devices: options.device holds the shards (drawn on the host, then moved), the lookups and the
// output, and, from a table's first update on, its optimizer state; the device is fixed at
// construction (Module::to does not move a sharded collection: build it where it trains). The
// input KJT stays on the host, where its ids are checked and routed over `group`. Collectives
// run on their group's device (embedding_dist.h): GPU tables exchange their outputs over an NCCL
// `output_group` (TorchRec's way), or through host memory when the outputs go over an MPI group;
// one rank exchanges nothing. table_row_wise outputs go over the mesh's groups: build the mesh
// over the output group's ranks (e.g. the NCCL world) to keep them on the device.
// Tables: f32 or f64. The forward validates the input on each rank (lengths, ids against the
// global table sizes) before any collective; a rank whose input is bad throws, and the others
// end at the collective timeout with a report (process_group.h).
// The module captures `this` in its backward: it must outlive its graphs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/embedding/sharding_plan.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/nn/module.h"
#include "runtime/sparse/fused_optimizer.h"
#include "runtime/sparse/keyed_jagged_tensor.h"
#include "runtime/sparse/keyed_tensor.h"
#include "runtime/sparse/kv/kv_table.h"
#include "runtime/sparse/row_update.h"
#include "runtime/sparse/table_collection.h"

namespace mt::parallel {

// A shard this rank holds, in global coordinates (what a checkpoint saves).
struct LocalShard {
  std::string table;
  std::string fqn;  // "embedding_bags.<table>.weight", relative to the collection
  ShardingType type;
  ShardMetadata placement;            // rows/cols of the global table, and this rank
  std::vector<int64_t> global_shape;  // [num_embeddings, embedding_dim]
  bool replicated = false;            // data_parallel: the same values on every rank (save once)
  runtime::Tensor weight;             // the parameter [num_rows, num_cols]; undefined for kv
  // A kv-backed shard (EmbeddingBagConfig::storage = Kv): its rows and row-optimizer state.
  std::shared_ptr<runtime::sparse::KvTable> kv = nullptr;
};

class ShardedEmbeddingBagCollection : public runtime::nn::Module {
 public:
  // `mesh`: a 2-D (node, local) mesh over the group's ranks, needed when the plan has
  // table_row_wise tables (its dim 1 size must be plan.ranks_per_node()). Validates the plan
  // against the tables and the group (collective only in that every rank must construct it).
  // `output_group`: the same ranks as `group` in the same order, for the pooled outputs'
  // exchange, its backward and the data_parallel gradient sum (null: `group`). With GPU tables
  // give an NCCL group here and keep `group` on the host (MPI), where the ids are routed. When
  // given, every rank checks the order with one all-gather over `group`.
  ShardedEmbeddingBagCollection(std::vector<EmbeddingBagConfig> tables, ShardingPlan plan,
                                std::shared_ptr<ProcessGroup> group,
                                std::shared_ptr<DeviceMesh> mesh = nullptr,
                                runtime::sparse::CollectionOptions options = {},
                                std::shared_ptr<ProcessGroup> output_group = nullptr);
  ~ShardedEmbeddingBagCollection() override;

  // Collective. `features` holds this rank's samples; it must have every feature of the
  // collection (extra keys are ignored, any key order).
  runtime::sparse::KeyedTensor operator()(const runtime::sparse::KeyedJaggedTensor& features);

  const std::vector<EmbeddingBagConfig>& table_configs() const { return configs_; }
  const ShardingPlan& plan() const { return plan_; }
  const runtime::sparse::CollectionOptions& options() const { return options_; }
  ProcessGroup& group() const { return *group_; }
  // Features in output order (table by table, as the unsharded collection) and their dims.
  const std::vector<std::string>& feature_names() const { return feature_names_; }
  const std::vector<int64_t>& feature_dims() const { return feature_dims_; }

  // The shards this rank holds (non-empty ones), in table order.
  std::vector<LocalShard> local_shards() const;

  // The fused row optimizers' state of this rank's shards, keyed "<weight fqn>.momentum1",
  // ".momentum2", ".step" (local rows of the shard; see local_shards() for its global place).
  // Managed-collision evictions (runtime/sparse/managed_collision.h): every rank re-initialises
  // the rows of `global_rows` it holds (all their columns; replicas alike) exactly as the
  // unsharded EmbeddingBagCollection::reset_rows does, and zeroes their fused optimizer state.
  // Not collective: give every rank the same rows (e.g. all-gathered evictions).
  void reset_rows(const std::string& table_name, const std::vector<int64_t>& global_rows,
                  int64_t step);

  // The init context of table `table_name` (the unsharded table's, EmbeddingTable::init_context)
  // for this rank's shards of it whose values were copied rather than drawn: reset_rows (managed
  // collision) and a kv shard's never-seen rows then draw what the unsharded table would.
  void set_init_context(const std::string& table_name, const runtime::nn::InitContext& ctx);

  runtime::nn::StateDict optimizer_state_dict() const;
  void load_optimizer_state_dict(const runtime::nn::StateDict& state);
  void set_lr(double lr);

  // Kv-backed tables (see "Kv tables" above). Collective: routes `next_features` (the next
  // batch, as forward would) and starts reading the rows they will need on a background thread.
  void prefetch(const runtime::sparse::KeyedJaggedTensor& next_features);
  // Every kv shard's cache written to its store (before reading the shards' rows elsewhere).
  void flush_kv();
  // Cumulative statistics over this rank's kv shards (summed).
  runtime::sparse::KvStats kv_stats() const;

  // Called after every step with the rows it changed (global ids; see row_update.h), e.g. to
  // stream them to a serving replica. `with_state`: include the rows' optimizer state.
  void set_row_update_listener(runtime::sparse::RowUpdateListener listener, bool with_state);

  // GradientMode::RowSparse (see above). Gradients are in the shard's local rows.
  struct ShardGrad {
    std::string fqn;
    runtime::RowSparseGrad grad;
  };
  std::vector<ShardGrad> sparse_grads() const;
  // sum |g|^p over this rank's kept gradients (max for p = inf), data_parallel tables on rank 0
  // only: all-reduce it (sum, or max) with the dense partials for the total norm.
  double sparse_grad_norm_pow(double norm_type = 2.0) const;
  void scale_sparse_grads_(double coef);
  // One optimizer step of every group with the kept gradients, then drops them.
  void apply_sparse_grads();
  void zero_sparse_grads();

 private:
  struct Group;  // one sharding group: its tables, lookup layout, optimizer, kept gradients
  struct Plan;   // the exchange plan all ranks derive from the sharding plan

  struct Routed;  // a batch after the input dist: each group's lookup input

  void build();
  Routed route(const runtime::sparse::KeyedJaggedTensor& features);
  runtime::sparse::KeyedTensor forward(const runtime::sparse::KeyedJaggedTensor& kjt);
  // Kv: gathers the working sets the group's ids touch and returns the ids made positions in them.
  runtime::Tensor gather_kv_rows(Group& g, const runtime::Tensor& values,
                                 const runtime::Tensor& offsets, int64_t batch);
  // Kv: the group's working sets back to their caches (after its optimizer step, or unchanged).
  void commit_kv(Group& g);
  // A group's lookup-indexed gradients of one backward, by each table's update mode.
  void update_rows(Group& g, std::vector<runtime::RowSparseGrad> grads);
  // Tells the row listener about `changed` (lookup-indexed rows whose values changed).
  void report_rows(const Group& g, const std::vector<runtime::RowSparseGrad>& changed);
  void dp_sink(std::vector<runtime::RowSparseGrad>& grads);
  runtime::TableGradSink make_sink(int group);

  std::vector<EmbeddingBagConfig> configs_;
  ShardingPlan plan_;
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<ProcessGroup> output_group_;  // group_ unless given
  std::shared_ptr<DeviceMesh> mesh_;
  runtime::sparse::CollectionOptions options_;
  std::vector<std::string> feature_names_;
  std::vector<int64_t> feature_dims_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::unique_ptr<Plan> xplan_;
  runtime::Tensor anchor_;  // a leaf so the output node is recorded on every rank
  std::shared_ptr<runtime::sparse::KvStore> kv_store_;  // this rank's, when it holds kv shards
  runtime::sparse::RowUpdateListener row_listener_;
  bool row_listener_state_ = false;
};

}  // namespace mt::parallel
