// Parallelizes the MoE transformer (torchtitan's parallelize_deepseekv3, data and expert parallel
// parts): with an expert mesh, each MoE layer's routed experts keep only this rank's block of
// experts along `ep` (weights [E / ep, ...]), exchange tokens through a TokenDispatcher over the
// ep group (parallel/expert/token_exchange.h), and are sharded by FSDP over (dp_replicate, efsdp)
// -- along dim 1 when there are fewer local experts than efsdp ranks -- with DTensors in global
// [E, ...] coordinates on the expert mesh (checkpoints reshard to any ep). Then, as for llama, one
// FSDP group per block on dp_mesh and the root group.
#pragma once

#include "models/parallel_context.h"
#include "runtime/nn/module.h"

namespace mt::models::moe {

// No-op when context.dp_mesh is null. Throws when `model` is not a MoE Transformer, or when the
// routed experts do not split evenly over ep.
void parallelize(runtime::nn::Module& model, const ParallelContext& context);

}  // namespace mt::models::moe
