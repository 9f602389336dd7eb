// The text sample at the end of a run (Trainer::generate_sample): incremental decoding with the
// model spec's KV-cached forward (llama3, deepseek_v3), on the model or through a pipeline's
// stages.
#include <map>

#include "data/tokenizer/bpe_tokenizer.h"
#include "models/llama/generate.h"
#include "models/llama/kv_cache.h"
#include "models/registry.h"
#include "parallel/comm/process_group.h"
#include "parallel/pipeline/runner.h"
#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "train/model_spec.h"
#include "train/trainer.h"

namespace mt::train {

using runtime::Tensor;
namespace llama = models::llama;

bool Trainer::can_sample() const {
  return spec_->forward_cached != nullptr && spec_->make_kv_cache != nullptr;
}

llama::GenerateResult Trainer::decode(const std::vector<int64_t>& prompt,
                                      const llama::GenerateOptions& options) const {
  // The modules this rank decodes with, by stage index: the model, or its pipeline stages.
  std::map<int64_t, runtime::nn::Module*> modules;
  if (pipeline_) {
    for (const auto& stage : pipeline_->stages()) modules[stage.index] = stage.module.get();
  } else {
    modules[0] = model_.get();
  }
  std::map<int64_t, llama::KVCache> caches;
  for (const auto& [index, module] : modules)
    caches.emplace(index, spec_->make_kv_cache(*module, param_compute_dtype()));
  const auto forward = [&](int64_t index, runtime::nn::Module& module, const Tensor& x) {
    return spec_->forward_cached(module, x, caches.at(index));
  };
  const llama::DecodeStep step = [&](const Tensor& tokens) {
    const Tensor logits =  // [1, T, V] where this rank holds the output
        pipeline_ ? pipeline_->forward_through_stages(
                        tokens, spec_->hidden_shape(1, tokens.size(1)), forward)
                  : forward(0, *model_, tokens);
    return logits.defined() ? logits.select(0, 0).select(0, logits.size(1) - 1) : logits;
  };
  const llama::DecodeLimits limits{*vocab_size_of(*spec_), *max_seq_len_of(*spec_)};
  return llama::generate(limits, device_, step, prompt, options);
}

std::string Trainer::generate_sample(const std::string& prompt, int64_t max_new_tokens,
                                     double temperature) const {
  MT_CHECK(tp_ == 1, "train: sampling text after training is not supported with tensor "
           "parallelism yet (the logits are split over the tp ranks)");
  MT_CHECK(can_sample(), "train: sampling is implemented for llama3 and deepseek_v3 models, not ",
           config_.model.name);
  std::vector<int64_t> ids;
  if (prompt.empty()) {
    const auto start = tokenizer_->bos_id() ? tokenizer_->bos_id() : tokenizer_->eos_id();
    MT_CHECK(start.has_value(), "train: an empty prompt needs a BOS or EOS token");
    ids.push_back(*start);
  } else {
    for (int32_t t : tokenizer_->encode_ordinary(prompt)) ids.push_back(t);
  }
  const int64_t max_seq_len = *max_seq_len_of(*spec_);
  if (int64_t(ids.size()) > max_seq_len - 1) ids.erase(ids.begin(), ids.end() - (max_seq_len - 1));
  llama::GenerateOptions go;
  go.max_new_tokens = max_new_tokens;
  go.temperature = temperature;
  go.top_k = temperature > 0 ? 40 : 0;
  go.seed = uint64_t(config_.training.seed);
  if (tokenizer_->eos_id()) go.eos_id = *tokenizer_->eos_id();
  if (world_size() > 1) {
    // Every rank runs its (sharded) forward; one rank's token is everyone's, so logits that
    // differ in the last bit between ranks cannot make one rank stop at EOS while the others go
    // on. That rank is rank 0, or with a pipeline the first rank of the last stage's pp rank (pp
    // is the outermost mesh dimension).
    const int root =
        pipeline_ ? int(parallel::pipeline::stage_rank(pipeline_->schedule().num_stages() - 1, pp_) *
                        (world_size() / pp_))
                  : 0;
    go.agree_on_token = [this, root](int64_t token) {
      Tensor t = runtime::from_vector<int64_t>({token}, {1}, {runtime::DType::I64});
      world_->broadcast(t, root, "sample.token");
      return t.item<int64_t>();
    };
  }
  const llama::GenerateResult r = decode(ids, go);
  std::vector<int32_t> out;
  for (int64_t t : r.tokens)
    if (!go.eos_id || t != *go.eos_id) out.push_back(int32_t(t));
  return tokenizer_->decode_model_output(out);
}

}  // namespace mt::train
