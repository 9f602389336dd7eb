// Text generation from the Llama Transformer with a KV cache: the prompt is processed at once
// (prefill), then one token per step (Transformer::forward_cached), each drawn from the last
// position's logits by sample_next_token:
//   temperature 0      greedy: the argmax (ties: the lowest id)
//   temperature T > 0  softmax(logits / T) restricted to the top_k largest logits (top_k 0: the
//                      whole vocabulary; top_k >= vocab is the whole vocabulary too), drawn by
//                      inverse CDF over the candidates in descending order with the uniform
//                      u = uniform_at(RandomKey(seed, "generate"), step): the same seed gives the
//                      same sample on any machine and thread count.
// Generation stops after an EOS token (which is returned), after max_new_tokens, or when prompt +
// generated tokens reach the model's max_seq_len (every returned token can be fed back).
// Several ranks generating with one sharded (FSDP) model must take the same tokens, or one stops
// at EOS while the others wait in their next all-gather: agree_on_token makes the choice common.
// Batch 1; token ids only (the tokenizer lives in data/: tools/generate.cpp does text).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "models/llama/model.h"
#include "runtime/core/rng.h"

namespace mt::models::llama {

struct GenerateOptions {
  int64_t max_new_tokens = 64;                   // >= 0
  double temperature = 0.0;                      // >= 0; 0: greedy
  int64_t top_k = 0;                             // >= 0; 0: no top-k filter
  uint64_t seed = 0;                             // sampling stream RandomKey(seed, "generate")
  std::optional<int64_t> eos_id = std::nullopt;  // stop after this token
  // The dtype the model computes in (the KV cache's): default the parameters' dtype; set it to
  // the mixed-precision param dtype for an FSDP model.
  std::optional<runtime::DType> compute_dtype = std::nullopt;
  // Called with each sampled token; the token generation goes on with (and returns) is its
  // result, e.g. rank 0's token broadcast to every rank. Unset: the sampled token.
  std::function<int64_t(int64_t)> agree_on_token = nullptr;
};

enum class StopReason { Eos, MaxNewTokens, MaxSeqLen };
const char* stop_reason_name(StopReason reason);  // "eos", "max_new_tokens", "max_seq_len"

struct GenerateResult {
  std::vector<int64_t> tokens;  // the new tokens (the prompt not included; EOS included)
  StopReason stop_reason = StopReason::MaxNewTokens;
};

// Throws mt::Error naming the field for temperature < 0 or not finite, top_k < 0,
// max_new_tokens < 0.
void validate(const GenerateOptions& options);

// The next token from logits [V] (any floating dtype; computed in f64) as described above, with
// the uniform draw number `step`. Throws on non-finite logits.
int64_t sample_next_token(const Tensor& logits, double temperature, int64_t top_k,
                          const runtime::RandomKey& key, uint64_t step);

// Generates up to options.max_new_tokens after `prompt` (1 <= size <= max_seq_len, ids in
// [0, vocab)). Leaves the model's autograd state alone (runs without grad).
GenerateResult generate(Transformer& model, const std::vector<int64_t>& prompt,
                        const GenerateOptions& options);

// One decoding step of a model that may be split over ranks (pipeline stages): the new tokens
// [1, T] (i64, on the model's device) at the next T positions -> the logits [V] of the last one
// where this rank computes them, or an undefined tensor where it does not (then
// options.agree_on_token must bring the token from a rank that does; it is called with -1).
using DecodeStep = std::function<Tensor(const Tensor& tokens)>;

// The ids a token may take, [0, vocab_size) (the tokenizer's: a padded model's logits are wider,
// and its ids past these are never sampled), and the longest sequence the model takes (prompt +
// generated tokens).
struct DecodeLimits {
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;
};

// generate() above with any decoder behind `step` (llama's, the MoE model's, a pipeline's
// stages), its tokens on `device`: the same checks, loop, sampling and stop rules.
GenerateResult generate(const DecodeLimits& limits, runtime::Device device, const DecodeStep& step,
                        const std::vector<int64_t>& prompt, const GenerateOptions& options);

}  // namespace mt::models::llama
