#include "models/llama/generate.h"

#include <algorithm>
#include <cmath>

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/softmax.h"
#include "runtime/ops/sort.h"

namespace mt::models::llama {

using runtime::DType;

const char* stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::Eos:
      return "eos";
    case StopReason::MaxNewTokens:
      return "max_new_tokens";
    case StopReason::MaxSeqLen:
      return "max_seq_len";
  }
  return "unknown";
}

void validate(const GenerateOptions& options) {
  MT_CHECK(std::isfinite(options.temperature) && options.temperature >= 0,
           "generate: expected temperature >= 0 (0: greedy), got ", options.temperature);
  MT_CHECK(options.top_k >= 0, "generate: expected top_k >= 0 (0: no top-k filter), got ",
           options.top_k);
  MT_CHECK(options.max_new_tokens >= 0, "generate: expected max_new_tokens >= 0, got ",
           options.max_new_tokens);
}

int64_t sample_next_token(const Tensor& logits, double temperature, int64_t top_k,
                          const runtime::RandomKey& key, uint64_t step) {
  MT_CHECK(
      logits.defined() && logits.dim() == 1 && logits.size(0) >= 1 && logits.is_floating_point(),
      "generate: expected floating logits [V], got ",
      logits.defined() ? logits.shape() : runtime::Shape{});
  MT_CHECK(std::isfinite(temperature) && temperature >= 0,
           "generate: expected temperature >= 0 (0: greedy), got ", temperature);
  MT_CHECK(top_k >= 0, "generate: expected top_k >= 0 (0: no top-k filter), got ", top_k);
  runtime::NoGradGuard no_grad;
  const Tensor x = logits.detach().to(DType::F64);
  for (double v : x.to_vector<double>()) {
    MT_CHECK(std::isfinite(v), "generate: non-finite logit ", v, " at step ", step);
  }
  const int64_t vocab = x.size(0);
  if (temperature == 0) return runtime::topk(x, 1).indices.item<int64_t>();

  const int64_t k = (top_k == 0 || top_k > vocab) ? vocab : top_k;
  runtime::ValuesIndices top = runtime::topk(runtime::div(x, temperature), k);  // descending
  const std::vector<double> probs = runtime::softmax(top.values, 0).to_vector<double>();
  const std::vector<int64_t> ids = top.indices.to_vector<int64_t>();
  double total = 0;
  for (double p : probs) total += p;
  const double target = runtime::uniform_at(key, step) * total;
  double cumulative = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    cumulative += probs[i];
    if (target < cumulative) return ids[i];
  }
  return ids.back();  // rounding: u * total at the very top
}

GenerateResult generate(Transformer& model, const std::vector<int64_t>& prompt,
                        const GenerateOptions& options) {
  MT_CHECK(model.is_whole(), "generate: needs the whole model, not the pipeline stage of layers [",
           model.layer_range().begin, ", ", model.layer_range().end, ") (a pipeline decodes "
           "through its stages with the DecodeStep overload)");
  runtime::NoGradGuard no_grad;
  validate(options);  // before the cache is allocated
  KVCache cache = model.make_kv_cache(1, 0, options.compute_dtype);
  const DecodeStep step = [&](const Tensor& tokens) {
    const Tensor logits = model.forward_cached(tokens, cache);  // [1, T, V]
    return logits.select(0, 0).select(0, logits.size(1) - 1);
  };
  return generate({model.args().vocab_size, model.args().max_seq_len},
                  model.tok_embeddings->weight.device(), step, prompt, options);
}

GenerateResult generate(const DecodeLimits& limits, runtime::Device device, const DecodeStep& step,
                        const std::vector<int64_t>& prompt, const GenerateOptions& options) {
  validate(options);
  MT_CHECK(!prompt.empty(), "generate: expected a prompt of at least one token");
  MT_CHECK(int64_t(prompt.size()) <= limits.max_seq_len, "generate: prompt of ", prompt.size(),
           " tokens is longer than the model's max_seq_len = ", limits.max_seq_len);
  for (size_t i = 0; i < prompt.size(); ++i) {
    MT_CHECK(prompt[i] >= 0 && prompt[i] < limits.vocab_size, "generate: prompt token ", prompt[i],
             " at position ", i, " outside the vocabulary [0, ", limits.vocab_size, ")");
  }
  if (options.eos_id) {
    MT_CHECK(*options.eos_id >= 0 && *options.eos_id < limits.vocab_size, "generate: eos_id ",
             *options.eos_id, " outside the vocabulary [0, ", limits.vocab_size, ")");
  }

  runtime::NoGradGuard no_grad;
  const auto token_options = runtime::TensorOptions{}.with_dtype(DType::I64).with_device(device);
  const runtime::RandomKey key(options.seed, "generate");
  const int64_t room = limits.max_seq_len - int64_t(prompt.size());
  GenerateResult result;
  result.stop_reason =
      room < options.max_new_tokens ? StopReason::MaxSeqLen : StopReason::MaxNewTokens;
  const int64_t budget = std::min(room, options.max_new_tokens);
  if (budget == 0) return result;

  Tensor input = runtime::from_vector<int64_t>(prompt, {1, int64_t(prompt.size())}, token_options);
  for (int64_t s = 0; s < budget; ++s) {
    Tensor last = step(input);
    if (last.defined() && last.size(0) > limits.vocab_size)
      last = last.narrow(0, 0, limits.vocab_size);  // a padded vocab's other ids
    MT_CHECK(last.defined() || options.agree_on_token,
             "generate: the decoding step returned no logits and there is no agree_on_token to "
             "bring the token from another rank");
    int64_t next = last.defined() ? sample_next_token(last, options.temperature, options.top_k,
                                                      key, uint64_t(s))
                                  : -1;
    if (options.agree_on_token) {
      next = options.agree_on_token(next);
      MT_CHECK(next >= 0 && next < limits.vocab_size, "generate: agree_on_token returned ", next,
               ", outside the vocabulary [0, ", limits.vocab_size, ")");
    }
    result.tokens.push_back(next);
    if (options.eos_id && next == *options.eos_id) {
      result.stop_reason = StopReason::Eos;
      return result;
    }
    if (s + 1 < budget) input = runtime::from_vector<int64_t>({next}, {1, 1}, token_options);
  }
  return result;
}

}  // namespace mt::models::llama
