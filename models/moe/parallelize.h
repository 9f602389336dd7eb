// Parallelizes the MoE transformer (torchtitan's parallelize_deepseekv3, data and expert parallel
// parts): with an expert mesh, each MoE layer's routed experts keep only this rank's block of
// experts along `ep` (weights [E / ep, ...]), exchange tokens through a TokenDispatcher over the
// ep group (parallel/expert/token_exchange.h), and are sharded by FSDP over (dp_replicate, efsdp)
// -- along dim 1 when there are fewer local experts than efsdp ranks -- with DTensors in global
// [E, ...] coordinates on the expert mesh (checkpoints reshard to any ep). Then, as for llama, one
// FSDP group per block on dp_mesh and the root group.
//
// Tensor parallelism (context.tp_mesh): attention, norms, embeddings, output and the dense
// blocks' feed-forwards follow llama's plan (models/llama/parallelize.h). The MoE layers route
// each tp rank's sequence shard; their shared experts are split over tp (column-wise w1/w3,
// row-wise w2, the tokens all-gathered before and reduce-scattered after); the router and the
// routed experts are whole on every tp rank with gradients summed over tp -- tp acts as data
// parallelism for them (no TP inside routed experts yet) -- and routed experts keep expert
// parallelism: the expert mesh is then (dp_replicate, ep, efsdp, tp), tp innermost.
#pragma once

#include "models/moe/model_args.h"
#include "models/parallel_context.h"
#include "runtime/nn/module.h"

namespace mt::models::moe {

// No-op when context.dp_mesh is null. Throws when `model` is not a MoE Transformer, or when the
// routed experts do not split evenly over ep.
void parallelize(runtime::nn::Module& model, const ParallelContext& context);

// Throws, naming the numbers, when the model cannot take tensor parallelism over `tp` ranks
// (heads, kv heads). No communication.
void check_tensor_parallel(const ModelArgs& args, int64_t tp);

}  // namespace mt::models::moe
