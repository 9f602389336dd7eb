// Parallelizes a llama Transformer as torchtitan's parallelize_llama does: tensor (and sequence)
// parallelism over the tp mesh first, when there is one, then FSDP: one fully_shard group per
// TransformerBlock and the root group (embeddings, final norm, output), the tp pieces sharded
// over the data-parallel mesh (2-D FSDP x TP, 3-D HSDP x TP).
//
// The tensor-parallel plan (torchtitan's, parallel/tensor/tp_style.h for the styles):
//   tok_embeddings          RowwiseParallel(input Replicate, output Shard(1) [Replicate w/o SP])
//   attention_norm, ffn_norm, norm   SequenceParallel (without SP: left replicated)
//   attention, feed_forward PrepareModuleInput(Shard(1) [Replicate] -> Replicate)
//   wq, wk, wv, w1, w3      ColwiseParallel (heads / hidden units split)
//   wo, w2                  RowwiseParallel(output Shard(1) [Replicate])
//   output                  ColwiseParallel(input Shard(1) [Replicate], output Shard(-1) with
//                           loss parallel, else Replicate)
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/llama/model_args.h"
#include "models/parallel_context.h"
#include "parallel/tensor/tp_style.h"
#include "runtime/nn/module.h"

namespace mt::models::llama {

// No-op when context.dp_mesh is null. Throws when `model` is not a llama Transformer.
void parallelize(runtime::nn::Module& model, const ParallelContext& context);

// Throws, naming the numbers, when a model with these head counts cannot be split over `tp`
// ranks (heads and kv heads must divide by tp). Needs no communication: call it before any.
void check_tensor_parallel(const ModelArgs& args, int64_t tp);
void check_tensor_parallel_heads(int64_t n_heads, int64_t n_kv_heads, int64_t tp);

// The plan above by FQN, shared with the MoE model (same names): the embeddings, the norms and
// attention of the blocks `layers` (global indices: a pipeline stage holds some), the
// feed-forward of those `dense(i)` says have one, the final norm and the output (those a stage
// lacks are skipped). Other feed-forwards (MoE layers) are the caller's.
void apply_tensor_parallel_plan(runtime::nn::Module& model, const std::vector<int64_t>& layers,
                                const std::function<bool(int64_t)>& dense,
                                const ParallelContext& context, parallel::TensorParallel& tp);

}  // namespace mt::models::llama
