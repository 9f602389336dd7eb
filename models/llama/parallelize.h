// Applies FSDP to a llama Transformer (torchtitan's parallelize_llama, data parallel part): one
// fully_shard group per TransformerBlock, then the root group (embeddings, final norm, output).
#pragma once

#include "models/parallel_context.h"
#include "runtime/nn/module.h"

namespace mt::models::llama {

// No-op when context.dp_mesh is null. Throws when `model` is not a llama Transformer.
void parallelize(runtime::nn::Module& model, const ParallelContext& context);

}  // namespace mt::models::llama
