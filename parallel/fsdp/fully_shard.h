// fully_shard: FSDP2-style per-parameter sharding of a module (torch.distributed.fsdp.fully_shard).
//
//   auto dp = DeviceMesh::create(world, {world->size()}, {"dp_shard"});
//   for (auto& block : model->blocks) fully_shard(*block, dp);   // one group per block
//   fully_shard(*model, dp, {.reshard_after_forward = false});   // the rest (root)
//   auto opt = AdamW(model->parameters(), ...);                  // steps the local shards
//
// What happens
// - Every parameter of `module` not already managed by a fully_shard call on a descendant (so:
//   call it bottom-up) is sharded on dim 0 (options.shard_dim) over the mesh's last dimension
//   (uneven sizes padded; see FSDPParam). Meshes may differ per module: routed experts on the
//   expert mesh's efsdp dimension, the rest on the data-parallel mesh (options.outer). Module
//   slots then hold the sharded leaves: parameters(), optimizers, clipping and checkpointing see
//   shards, described by sharded_parameters()/dtensor_of().
// - Shards live on the mesh's device (the NCCL group's GPU; the host for MPI), wherever the
//   module's parameters were: a model built on the host is sharded there and only each rank's
//   shards move to its GPU (as FSDP1's device_id). Move the module's buffers with Module::to.
// - Before the module's forward, its group is all-gathered with one collective (prefetched one
//   group ahead, in the order of the previous forward) and the slots point at the unsharded
//   tensors; after it, the slots point back at the shards and, with reshard_after_forward, the
//   unsharded memory is freed. Before the module's backward it is all-gathered again (the group
//   that runs backward next is prefetched), and right after it the gradients are reduce-scattered
//   with one collective (asynchronously, finished before the next group's or at the end of the
//   backward pass), the unsharded memory is freed, and the shards' .grad accumulate the result.
// - HSDP: on a 2-D mesh (replicate, shard) the gradients are reduce-scattered over the shard
//   dimension and all-reduced over the replicate dimension.
// - Gradients are summed over all data-parallel ranks (the mesh) and divided by
//   gradient_divide_factor: 0 means the mesh size (the mean of the ranks' gradients, as torch);
//   use 1 when the loss is already normalised globally (the trainer divides by the global
//   number of tokens).
// - The outermost fully_shard module called is the root of a forward pass: at the end of the
//   backward pass it finishes every pending reduction and reshards every group.
// - Under no_grad (evaluation, generation) groups are always resharded after their forward.
// - Each module should run once per forward pass. Tied parameters (one tensor in several slots)
//   are not supported and rejected.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/fsdp/fsdp_param_group.h"
#include "parallel/fsdp/mixed_precision.h"
#include "parallel/mesh/device_mesh.h"
#include "parallel/mesh/dtensor.h"
#include "runtime/nn/module.h"

namespace mt::parallel {

struct FullyShardOptions {
  bool reshard_after_forward = true;
  MixedPrecisionPolicy mp_policy;
  double gradient_divide_factor = 0;  // 0: the mesh size (mean)
  bool prefetch = true;               // all-gather the next group while this one computes
  // Float8 all-gather (torchtitan's enable_fsdp_float8_all_gather): the weights of float8
  // linears (nn::Linear::float8, sharded on dim 0; with an outer sharding only when
  // float8_amax_group is given) travel as e4m3 codes with the whole weight's scale, half the
  // bytes of bf16 (FSDPParamGroup says how).
  bool float8_all_gather = false;
  // Tensor parallelism: the ranks holding the other pieces of each weight the outer sharding
  // splits (the tp group). The shards' amaxes are reduced over it too, so each piece is scaled
  // as the whole weight, as the layer's own casts are (their amaxes reduced over tp).
  std::shared_ptr<ProcessGroup> float8_amax_group;
  // The tensor dim the parameters are sharded along (routed experts [E, ...] use 1 when E is
  // smaller than the ranks that shard them).
  int64_t shard_dim = 0;
  // Parameters already sharded by expert parallelism: their DTensors are placed on this larger
  // mesh (`mesh` must be a sub-mesh of it), FSDP's Shard nested after the outer placements.
  std::optional<OuterSharding> outer;
  // Per parameter (tensor parallelism: each split its own way, parallel/tensor/tp_style.h):
  // the outer sharding of a parameter, or nullopt for `outer`'s. Called once per parameter.
  std::function<std::optional<OuterSharding>(const Tensor& param)> outer_of;
};

class FSDPState;

// The handle fully_shard returns (also kept alive by the module's hooks).
class FSDPModule {
 public:
  runtime::nn::Module& module() const;
  // Null when the module had no parameters of its own to shard.
  FSDPParamGroup* group() const;
  void set_reshard_after_forward(bool on);
  // Explicit all-gather / free of this module's parameters (e.g. around generation).
  void unshard();
  void reshard();

 private:
  friend std::shared_ptr<FSDPModule> fully_shard(runtime::nn::Module&, std::shared_ptr<DeviceMesh>,
                                                 FullyShardOptions);
  explicit FSDPModule(std::shared_ptr<FSDPState> state) : state_(std::move(state)) {}
  std::shared_ptr<FSDPState> state_;
};

std::shared_ptr<FSDPModule> fully_shard(runtime::nn::Module& module,
                                        std::shared_ptr<DeviceMesh> mesh,
                                        FullyShardOptions options = {});

// A parameter as the distributed code sees it: its tensor (the local shard for FSDP parameters)
// and, for sharded ones, the DTensor placing it on its mesh.
struct DistributedParam {
  std::string fqn;
  Tensor param;
  const DTensor* dtensor = nullptr;  // null: a plain tensor, the same on every rank
};
// Every parameter of `module` (with FQNs relative to it), sharded or not, in registration order.
std::vector<DistributedParam> distributed_parameters(runtime::nn::Module& module);

// Draws the initial values of a model built under nn::DeferredInitGuard and then fully_shard'ed,
// each rank its shards only: every module's reset_parameters runs on its parameters' shards in an
// nn::InitBlockScope that places each shard in its parameter (the DTensor's global shape and
// offset), so the shards hold what Module::init_weights(seed) on the whole model and sharding
// would give, and no rank ever holds a whole parameter. Throws, naming it, for a parameter that
// fully_shard does not manage.
void init_sharded_parameters(runtime::nn::Module& root, uint64_t seed);

// torchtitan's precompute_float8_dynamic_scale_for_fsdp: the amaxes of every weight FSDP gathers
// as float8 codes under `root` (FullyShardOptions::float8_all_gather) in ONE all-reduce per shard
// group, instead of one per FSDP group at each all-gather. They hold until clear_float8_scales:
// call it once the weights change (the trainer brackets each training step with the two).
void precompute_float8_scales(runtime::nn::Module& root);
void clear_float8_scales(runtime::nn::Module& root);

}  // namespace mt::parallel
