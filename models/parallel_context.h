// ParallelContext: how the trainer wants a model parallelized, handed to the model's parallelize
// hook (ModelSpec::parallelize). Built from the [parallelism] config by the trainer.
#pragma once

#include <memory>

#include "parallel/fsdp/mixed_precision.h"
#include "parallel/mesh/device_mesh.h"

namespace mt::models {

struct ParallelContext {
  // The data-parallel mesh FSDP shards over: 1-D (dp_shard) or 2-D (dp_replicate, dp_shard) for
  // HSDP; under context parallelism the shard dim is dp_shard_cp (dp_shard x cp: the cp ranks'
  // gradients add up too). Null: no data parallelism (the model stays as built).
  std::shared_ptr<parallel::DeviceMesh> dp_mesh;
  // Expert parallelism (parallelism.expert_parallel_degree > 1): the expert mesh
  // (dp_replicate, ep, efsdp) over the same ranks, efsdp = dp_shard / ep (torchtitan's layout,
  // with ep outside efsdp so a rank's experts are a contiguous block of the global [E, ...]
  // weights and FSDP's shard nests inside it). Routed experts are split over `ep` and sharded by
  // FSDP over (dp_replicate, efsdp); everything else stays on dp_mesh. Null: no expert parallelism
  // (experts are sharded on dp_mesh like the rest).
  std::shared_ptr<parallel::DeviceMesh> expert_mesh;
  // Tensor parallelism (parallelism.tensor_parallel_degree > 1): the whole mesh
  // (dp_replicate, dp_shard, tp) (dp_mesh is its data-parallel sub-mesh) and its 1-D tp
  // sub-mesh. The model's TP plan splits its layers over tp_mesh, then FSDP shards those pieces
  // over dp_mesh, placing them on world_mesh. Null: no tensor parallelism.
  std::shared_ptr<parallel::DeviceMesh> world_mesh, tp_mesh;
  // With tp: norms and the residual stream run on sequence shards (Megatron's sequence
  // parallelism), and the output projection keeps the logits split over the vocabulary for a
  // loss-parallel cross-entropy (the model's loss_logits are then this rank's vocab columns).
  bool sequence_parallel = true;
  bool loss_parallel = true;
  // Free each block's gathered parameters after its forward (all-gather again for backward).
  bool reshard_after_forward = true;
  // The same for the root group (embeddings, final norm, output): it runs first in backward, so
  // keeping it saves an all-gather.
  bool reshard_root_after_forward = false;
  parallel::MixedPrecisionPolicy mp_policy;
  // FSDP gathers float8 linears' weights as FP8 codes (FullyShardOptions::float8_all_gather).
  bool float8_all_gather = false;
  // Summed gradients are divided by this. The trainer normalises its loss by the global token
  // count, so the sum over ranks is already the mean gradient: 1.
  double gradient_divide_factor = 1.0;
};

}  // namespace mt::models
