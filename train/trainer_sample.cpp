// The text sample at the end of a run (Trainer::generate_sample): incremental decoding with the
// model spec's KV-cached forward (llama3, deepseek_v3), on the model or through a pipeline's
// stages, under FSDP, EP and TP (split heads, sequence-parallel padding, vocab-split logits
// gathered).
#include <map>

#include "data/tokenizer/bpe_tokenizer.h"
#include "models/llama/generate.h"
#include "models/llama/kv_cache.h"
#include "models/registry.h"
#include "parallel/comm/process_group.h"
#include "parallel/mesh/device_mesh.h"
#include "parallel/mesh/dtensor.h"
#include "parallel/pipeline/runner.h"
#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"
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
  // Under tensor parallelism each rank holds kv_heads / tp heads of each layer, and a forward's
  // tokens are split over tp (sequence parallelism; without it, a MoE layer still routes its
  // share of the tokens), so each step runs on tokens padded to a multiple of tp (at the end:
  // causal attention keeps them from the real positions, and the caches forget them after the
  // step). So a sample stops up to tp - 1 tokens before max_seq_len.
  std::map<int64_t, llama::KVCache> caches;
  for (const auto& [index, module] : modules)
    caches.emplace(index, spec_->make_kv_cache(*module, param_compute_dtype(), tp_));
  const int64_t multiple = tp_;
  // Between pipeline stages: this rank's sequence shard with sequence parallelism, else all.
  const int64_t shards = config_.parallelism.enable_sequence_parallel ? tp_ : 1;
  const bool vocab_split = tp_ > 1 && !config_.parallelism.disable_loss_parallel;
  const auto forward = [&](int64_t index, runtime::nn::Module& module, const Tensor& x) {
    return spec_->forward_cached(module, x, caches.at(index));
  };
  const llama::DecodeStep step = [&](const Tensor& tokens) {
    const int64_t t = tokens.size(1), padded = (t + multiple - 1) / multiple * multiple;
    const int64_t position = caches.begin()->second.length();
    const Tensor input =
        padded == t ? tokens
                    : runtime::cat({tokens, runtime::zeros({1, padded - t}, tokens.options())}, 1);
    const Tensor logits =  // [1, padded, V or this rank's vocab columns] with the output
        pipeline_ ? pipeline_->forward_through_stages(
                        input, spec_->hidden_shape(1, padded / shards), forward)
                  : forward(0, *model_, input);
    for (auto& [index, cache] : caches) cache.truncate(position + t);
    if (!logits.defined()) return logits;
    const Tensor last = logits.select(0, 0).select(0, t - 1);
    if (!vocab_split) return last;
    return parallel::gather_shards(tp_mesh_->group(0), last.contiguous(), 0,
                                   *vocab_size_of(*spec_), "sample.logits");
  };
  // The tokenizer's ids (a padded vocab's others are never sampled); room for the padding of
  // the last step.
  const llama::DecodeLimits limits{tokenizer_->vocab_size(),
                                   *max_seq_len_of(*spec_) - (multiple - 1)};
  return llama::generate(limits, device_, step, prompt, options);
}

std::string Trainer::generate_sample(const std::string& prompt, int64_t max_new_tokens,
                                     double temperature) const {
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
  // Room for one new token (and the padding tensor parallelism adds: decode()).
  const int64_t room = *max_seq_len_of(*spec_) - 1 - (tp_ - 1);
  if (int64_t(ids.size()) > room) ids.erase(ids.begin(), ids.end() - room);
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
