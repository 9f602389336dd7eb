// Validation of a resolved JobConfig, in two steps:
//  - validate(): each value against its key's rule (schema.cpp) and the rules that tie keys
//    together (batch sizes, checkpoint interval when enabled, ...). load_config()
//    calls it, so a loaded config is always valid on its own.
//  - validate_for_world(): the rules that need the number of ranks (the data-parallel degree is
//    known only at run time); it returns the resulting layout, e.g. the gradient accumulation.
// Messages name the key, the value, where it was set (file and line, or flag) and the rule.
#pragma once

#include <cstdint>

#include "train/config/job_config.h"

namespace mt::train::config {

void validate(const JobConfig& config);

// How a job config maps onto `world_size` ranks.
struct WorldLayout {
  int64_t dp_replicate = 1;       // parallelism.data_parallel_replicate_degree
  int64_t dp_shard = 1;           // parallelism.data_parallel_shard_degree, -1 resolved
  int64_t dp = 1;                 // dp_replicate x dp_shard: ranks that see different data
                                  // (world = pp x dp x cp x tp)
  int64_t cp = 1;                 // parallelism.context_parallel_degree
  int64_t ep = 1;                 // parallelism.expert_parallel_degree
  int64_t tp = 1;                 // parallelism.tensor_parallel_degree
  int64_t pp = 1;                 // parallelism.pipeline_parallel_degree
  int64_t microbatches = 1;       // pipeline micro-batches per local batch (pp > 1)
  int64_t global_batch_size = 0;  // training.global_batch_size, -1 resolved
  int64_t grad_accum_steps = 1;   // micro-steps per optimizer step
};

WorldLayout validate_for_world(const JobConfig& config, int64_t world_size);

}  // namespace mt::train::config
