// ParallelContext: how the trainer wants a model parallelized, handed to the model's parallelize
// hook (ModelSpec::parallelize). Built from the [parallelism] config by the trainer.
#pragma once

#include <memory>

#include "parallel/fsdp/mixed_precision.h"
#include "parallel/mesh/device_mesh.h"

namespace mt::models {

struct ParallelContext {
  // The data-parallel mesh FSDP shards over: 1-D (dp_shard) or 2-D (dp_replicate, dp_shard) for
  // HSDP. Null: no data parallelism (the model stays as built).
  std::shared_ptr<parallel::DeviceMesh> dp_mesh;
  // Free each block's gathered parameters after its forward (all-gather again for backward).
  bool reshard_after_forward = true;
  // The same for the root group (embeddings, final norm, output): it runs first in backward, so
  // keeping it saves an all-gather.
  bool reshard_root_after_forward = false;
  parallel::MixedPrecisionPolicy mp_policy;
  // Summed gradients are divided by this. The trainer normalises its loss by the global token
  // count, so the sum over ranks is already the mean gradient: 1.
  double gradient_divide_factor = 1.0;
};

}  // namespace mt::models
