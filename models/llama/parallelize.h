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

#include "models/llama/model_args.h"
#include "models/parallel_context.h"
#include "runtime/nn/module.h"

namespace mt::models::llama {

// No-op when context.dp_mesh is null. Throws when `model` is not a llama Transformer.
void parallelize(runtime::nn::Module& model, const ParallelContext& context);

// Throws, naming the numbers, when a model of these args cannot be split over `tp` ranks (heads
// and kv heads must divide by tp). Needs no communication: call it before any.
void check_tensor_parallel(const ModelArgs& args, int64_t tp);

}  // namespace mt::models::llama
