// FSDP for llama: blocks first (bottom-up), then the root.
#include "models/llama/parallelize.h"

#include "models/llama/model.h"
#include "parallel/fsdp/fully_shard.h"
#include "runtime/core/error.h"

namespace mt::models::llama {

void parallelize(runtime::nn::Module& model, const ParallelContext& context) {
  if (!context.dp_mesh) return;
  auto* llama = dynamic_cast<Transformer*>(&model);
  MT_CHECK(llama != nullptr, "llama parallelize: expected a llama Transformer, got ",
           model.type_name());
  MT_CHECK(context.expert_mesh == nullptr, "llama has no routed experts: "
           "parallelism.expert_parallel_degree must be 1 for it");
  parallel::FullyShardOptions options;
  options.reshard_after_forward = context.reshard_after_forward;
  options.mp_policy = context.mp_policy;
  options.gradient_divide_factor = context.gradient_divide_factor;
  // The last block's parameters are the first the backward needs: like the root's, they stay
  // unsharded after the forward unless resharding is "always" (torchtitan's default policy).
  for (const auto& block : llama->blocks) {
    if (block == llama->blocks.back())
      options.reshard_after_forward = context.reshard_root_after_forward;
    parallel::fully_shard(*block, context.dp_mesh, options);
  }
  options.reshard_after_forward = context.reshard_root_after_forward;
  parallel::fully_shard(model, context.dp_mesh, options);
}

}  // namespace mt::models::llama
