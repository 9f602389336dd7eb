// Text generation with any decoder of the registry (ModelSpec::make_kv_cache / forward_cached:
// llama3, deepseek_v3): the whole model in this process, batch 1, through llama::generate's loop
// (sampling, stop rules, agree_on_token). mt_generate decodes with it; the trainer's sample adds
// pipeline stages and tensor parallelism around the same hooks (train/trainer_sample.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "models/llama/generate.h"
#include "models/registry.h"

namespace mt::models {

// Throws when the spec has no cached-decoding hooks. The KV cache is in options.compute_dtype,
// else the model's parameters' dtype.
llama::GenerateResult generate(const ModelSpec& spec, runtime::nn::Module& model,
                               const llama::DecodeLimits& limits,
                               const std::vector<int64_t>& prompt,
                               const llama::GenerateOptions& options);

}  // namespace mt::models
