// The text sample at the end of a run (Trainer::generate_sample): llama's incremental decoding,
// on the whole model or through a pipeline's stages.
#include <map>

#include "data/tokenizer/bpe_tokenizer.h"
#include "models/llama/generate.h"
#include "models/llama/kv_cache.h"
#include "models/llama/model.h"
#include "models/registry.h"
#include "parallel/comm/process_group.h"
#include "parallel/pipeline/runner.h"
#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "train/trainer.h"

namespace mt::train {

using runtime::Tensor;
namespace llama = models::llama;

llama::Transformer* Trainer::sampling_model() const {
  if (!pipeline_) return dynamic_cast<llama::Transformer*>(model_.get());
  return dynamic_cast<llama::Transformer*>(pipeline_->stages().front().module.get());
}

llama::GenerateResult Trainer::generate_through_pipeline(
    const std::vector<int64_t>& prompt, const llama::GenerateOptions& options) const {
  const llama::ModelArgs& args = sampling_model()->args();
  std::map<int64_t, llama::KVCache> caches;  // by stage index
  for (const auto& stage : pipeline_->stages()) {
    const auto& model = dynamic_cast<const llama::Transformer&>(*stage.module);
    caches.emplace(stage.index, model.make_kv_cache(1, 0, options.compute_dtype));
  }
  const auto forward = [&caches](int64_t stage, runtime::nn::Module& module, const Tensor& x) {
    return dynamic_cast<llama::Transformer&>(module).forward_cached(x, caches.at(stage));
  };
  const llama::DecodeStep step = [&](const Tensor& tokens) {
    const Tensor logits = pipeline_->forward_through_stages(
        tokens, spec_->hidden_shape(1, tokens.size(1)), forward);  // [1, T, V] on the last stage
    return logits.defined() ? logits.select(0, 0).select(0, logits.size(1) - 1) : logits;
  };
  return llama::generate(args, device_, step, prompt, options);
}

std::string Trainer::generate_sample(const std::string& prompt, int64_t max_new_tokens,
                                     double temperature) const {
  MT_CHECK(tp_ == 1, "train: sampling text after training is not supported with tensor "
           "parallelism yet (the logits are split over the tp ranks)");
  llama::Transformer* model = sampling_model();
  MT_CHECK(model != nullptr, "train: sampling is implemented for llama3 models only, not ",
           config_.model.name);
  const llama::ModelArgs& args = model->args();
  std::vector<int64_t> ids;
  if (prompt.empty()) {
    const auto start = tokenizer_->bos_id() ? tokenizer_->bos_id() : tokenizer_->eos_id();
    MT_CHECK(start.has_value(), "train: an empty prompt needs a BOS or EOS token");
    ids.push_back(*start);
  } else {
    for (int32_t t : tokenizer_->encode_ordinary(prompt)) ids.push_back(t);
  }
  if (int64_t(ids.size()) > args.max_seq_len - 1)
    ids.erase(ids.begin(), ids.end() - (args.max_seq_len - 1));
  llama::GenerateOptions go;
  go.max_new_tokens = max_new_tokens;
  go.temperature = temperature;
  go.top_k = temperature > 0 ? 40 : 0;
  go.seed = uint64_t(config_.training.seed);
  if (dp_mesh_ || pipeline_) go.compute_dtype = param_compute_dtype();
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
  const llama::GenerateResult r =
      pipeline_ ? generate_through_pipeline(ids, go) : llama::generate(*model, ids, go);
  std::vector<int32_t> out;
  for (int64_t t : r.tokens)
    if (!go.eos_id || t != *go.eos_id) out.push_back(int32_t(t));
  return tokenizer_->decode_model_output(out);
}

}  // namespace mt::train
