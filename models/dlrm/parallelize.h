// Parallelizes a DLRM (models/dlrm/model.h) the TorchRec way: the embedding tables become a
// parallel::ShardedEmbeddingBagCollection placed by a sharding plan (given, or chosen by
// parallel::plan_sharding under a per-rank memory budget and per-table constraints), and the dense
// parts (bottom MLP, DCN cross net, top MLP) are wrapped by FSDP (fully_shard) on the dp mesh.
//
//   DlrmParallelOptions opts;
//   opts.group = world;                                    // the tables' ranks
//   opts.dp_mesh = DeviceMesh::create(world, {world->size()}, {"dp_shard"});
//   opts.planner.memory_budget_bytes = 64 << 20;           // or opts.plan = a given plan
//   opts.planner.constraints["t_user_id"] = {.type = ShardingType::RowWise};
//   ShardingPlan plan = parallelize_dlrm(*model, opts);   // collective
//   Tensor loss = data_parallel_bce_loss(logits, labels, global_batch_size(*world, B));
//   loss.backward();                                       // this rank's share of the mean loss
//   double norm = clip_dlrm_grad_norm_(*model, 1.0);       // RowSparse: tables included
//
// Devices: the ids are routed on the host (the input KJT stays there); the tables, their
// lookups and outputs are on options.device (a GPU: the output exchange and the data_parallel
// gradient sum run over options.output_group, NCCL, or through host memory when that is MPI; see
// parallel/embedding/embedding_dist.h).
// Tables: the shards are copied from the model's current (unsharded) tables, so after
// init_weights(seed) on any world size every shard holds exactly the 1-process values (the fused
// row optimizers' state starts empty: parallelize before training). The FQNs stay
// "sparse_arch.embedding_bags.t_<feature>.weight" (each rank has its shards under those names;
// ranks with no shard of a table have no parameter for it).
//
// FSDP: one fully_shard group per dense sub-module (bottom_mlp, cross_net, top_mlp), bottom-up.
// No root group is made: DLRM has no dense parameter outside those modules, and a root
// fully_shard(model) would also shard the tables' parameters (fully_shard has no ignore list).
// Each group is then the root of its own pass and finishes its reduce-scatter at the end of the
// backward pass. dp_mesh null: the dense parts stay as they are (every rank a full copy, and the
// training loop must reduce their gradients itself).
//
// Loss convention (the one that gives the 1-process gradients for both parts): every rank
// backpropagates  sum of its samples' BCE / G  (G = the global batch: all ranks' samples), i.e.
// its share of the global mean loss (data_parallel_bce_loss). FSDP here SUMS the dense gradients
// over the dp ranks (gradient_divide_factor 1, not FSDP's default mean), and the sharded tables
// get the gradient of the sum of the ranks' losses (sharded_embedding_bag_collection.h), so both
// get the gradient of the global mean BCE, as one process over the global batch. The sum of the
// ranks' losses is the global mean loss (all-reduce it to log it).
//
// Clipping: dlrm_total_grad_norm / clip_dlrm_grad_norm_ return the total norm over the dense
// parameters (on their FSDP mesh, parallel/clip_grad.h) plus, in GradientMode::RowSparse, the
// tables' kept row-sparse gradients (each shard once: ShardedEmbeddingBagCollection::
// sparse_grad_norm_pow, all-reduced over the tables' group). In GradientMode::Fused the rows are
// updated inside backward and the tables are NOT in the norm nor clipped (as TorchRec does).
// Works on an unparallelized Dlrm too (one process: the EmbeddingBagCollection's sparse grads).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "models/dlrm/model.h"
#include "models/dlrm/sparse_arch.h"
#include "parallel/comm/process_group.h"
#include "parallel/embedding/planner.h"
#include "parallel/embedding/sharded_embedding_bag_collection.h"
#include "parallel/fsdp/mixed_precision.h"
#include "parallel/mesh/device_mesh.h"

namespace mt::models::dlrm {

// The sharded tables behind Dlrm's SparseArch interface (FQNs "embedding_bags.<table>.weight").
// Its forward is collective over the collection's group.
class ShardedSparseArch : public SparseArch {
 public:
  explicit ShardedSparseArch(std::shared_ptr<parallel::ShardedEmbeddingBagCollection> collection);
  runtime::sparse::KeyedTensor operator()(
      const runtime::sparse::KeyedJaggedTensor& features) override;
  parallel::ShardedEmbeddingBagCollection& collection() const { return *collection_; }

 private:
  std::shared_ptr<parallel::ShardedEmbeddingBagCollection> collection_;
};

struct DlrmParallelOptions {
  // The ranks the tables are sharded over (every rank of the job). Required.
  std::shared_ptr<parallel::ProcessGroup> group;
  // The same ranks for the tables' pooled outputs (ShardedEmbeddingBagCollection's
  // output_group: NCCL for GPU tables while `group` routes the ids on the host); null: group.
  std::shared_ptr<parallel::ProcessGroup> output_group;
  // FSDP's mesh for the dense parts (1-D, or 2-D for HSDP); null: no FSDP.
  std::shared_ptr<parallel::DeviceMesh> dp_mesh;
  // A (node, local) mesh over `group`'s ranks, needed when the plan has table_row_wise tables;
  // it carries their outputs, so build it over output_group when that is given.
  std::shared_ptr<parallel::DeviceMesh> node_mesh;
  // The plan to use as given (validated against the tables). Unset: plan_sharding(planner).
  std::optional<parallel::ShardingPlan> plan;
  // For plan_sharding: world_size, local_size (when node_mesh is set) and dtype are filled in
  // here from group, node_mesh and the tables; memory_budget_bytes and constraints are the
  // caller's.
  parallel::PlannerOptions planner;
  // Where the model trains: the shards are made there and the dense parts moved there before
  // FSDP wraps them (the unsharded tables never go there). Unset: the model's device() now.
  std::optional<runtime::Device> device;
  bool reshard_after_forward = true;  // for bottom_mlp / cross_net; top_mlp runs first in backward
  parallel::MixedPrecisionPolicy mp_policy;
};

// Collective over options.group (and dp_mesh). Returns the plan used. Throws mt::Error when the
// model is already parallelized, the group is missing, or the plan does not fit / is invalid.
parallel::ShardingPlan parallelize_dlrm(Dlrm& model, const DlrmParallelOptions& options);

// The global batch: the sum of every rank's local batch (collective: one all-reduce).
int64_t global_batch_size(parallel::ProcessGroup& group, int64_t local_batch_size);

// This rank's share of the global mean BCE: sum of bce_with_logits over its samples / G (see the
// loss convention above). G must be >= 1; an empty local batch gives 0 (still backpropagate it:
// the backward is collective).
runtime::Tensor data_parallel_bce_loss(const runtime::Tensor& logits, const runtime::Tensor& labels,
                                       int64_t global_batch_size);

// The total gradient norm (see "Clipping" above); collective over the dense meshes and, in
// RowSparse mode, the tables' group.
double dlrm_total_grad_norm(Dlrm& model, double norm_type = 2.0);
// The same, then scales the dense gradients and the tables' kept sparse gradients by
// max_norm / (total + 1e-6) when total > max_norm (runtime/optim/clip_grad.h's rules). Returns
// the total norm before clipping.
double clip_dlrm_grad_norm_(Dlrm& model, double max_norm, double norm_type = 2.0);
// Without a host read (for GPUs): the total norm of a model whose tables' gradients do not count
// (GradientMode::Fused: applied inside backward), as a 0-D f64 tensor on the dense parameters'
// device, all-reduced there (parallel::total_grad_norm_tensor). The clipping coefficient
// (runtime::optim::clip_coefficient) then goes to the dense optimizer's step. Throws for
// RowSparse models, whose tables' norm is summed on the host.
Tensor dlrm_dense_grad_norm_tensor(Dlrm& model, double norm_type = 2.0);

}  // namespace mt::models::dlrm
