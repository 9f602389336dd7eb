#include "models/decode.h"

#include "runtime/core/error.h"

namespace mt::models {

llama::GenerateResult generate(const ModelSpec& spec, runtime::nn::Module& model,
                               const llama::DecodeLimits& limits,
                               const std::vector<int64_t>& prompt,
                               const llama::GenerateOptions& options) {
  MT_CHECK(spec.make_kv_cache && spec.forward_cached, "generate: model ", spec.name,
           " has no KV-cached decoding (llama3 and deepseek_v3 do)");
  const auto params = model.named_parameters();
  MT_CHECK(!params.empty(), "generate: the ", spec.name, " model has no parameters");
  const Tensor& any = params.front().second;
  llama::validate(options);  // before the cache is allocated
  llama::KVCache cache =
      spec.make_kv_cache(model, options.compute_dtype.value_or(any.dtype()), /*kv_head_shards=*/1);
  const llama::DecodeStep step = [&](const Tensor& tokens) {
    const Tensor logits = spec.forward_cached(model, tokens, cache);  // [1, T, V]
    return logits.select(0, 0).select(0, logits.size(1) - 1);
  };
  return llama::generate(limits, any.device(), step, prompt, options);
}

}  // namespace mt::models
