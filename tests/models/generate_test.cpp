// models/llama generation: the KV-cached forward against the full forward, greedy decoding against
// a naive re-run without cache, sampling (top-k, temperature, reproducibility, distribution),
// stopping rules, the cross-rank token agreement hook and argument errors; pipeline stages, each
// with the cache of its own layers, decode as the whole model.
#include "models/llama/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "models/llama/kv_cache.h"
#include "models/llama/model.h"
#include "runtime/core/grad_mode.h"
#include "runtime/core/rng.h"
#include "runtime/nn/init.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"
#include "tests/testing/tensor_testing.h"

namespace mt::models::llama {
namespace {

using runtime::DType;
using runtime::Shape;
using testing::all_close;

ModelArgs tiny_args() {
  ModelArgs a;
  a.dim = 16;
  a.n_layers = 2;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.vocab_size = 50;
  a.multiple_of = 8;
  a.max_seq_len = 16;
  return a;
}

const TensorOptions kI64 = TensorOptions{}.with_dtype(DType::I64);
const DecodeLimits kTinyLimits{50, 16};  // tiny_args' vocab_size and max_seq_len

std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  runtime::RandomKey key(seed, "tokens");
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(runtime::uniform_at(key, i) * double(vocab));
  return v;
}

// spread: weights redrawn normal(0, 0.5) (norms kept at 1). At torchtitan's init (std 0.02)
// attention barely moves the logits and greedy decoding would not notice a wrong position offset;
// spread weights make every token matter (and f32 rounding larger, hence f64 where it is on).
std::shared_ptr<Transformer> tiny_model(DType dtype, uint64_t seed = 7, bool spread = true,
                                        LayerRange range = {}) {
  auto m = std::make_shared<Transformer>(tiny_args(), seed, TensorOptions{}, range);
  m->to(dtype);
  for (const auto& [name, p] : m->named_parameters()) {
    if (!spread) break;
    if (name.find("norm") == std::string::npos) {
      runtime::nn::init_normal_(p, runtime::RandomKey(seed, name), 0.0, 0.5);
    }
  }
  return m;
}

// Prefill of `prefill` tokens, then chunks of `chunk` tokens: the logits, concatenated.
Tensor incremental_logits(Transformer& m, const Tensor& tokens, int64_t prefill, int64_t chunk) {
  KVCache cache = m.make_kv_cache(tokens.size(0));
  std::vector<Tensor> parts{m.forward_cached(tokens.narrow(1, 0, prefill), cache)};
  for (int64_t p = prefill; p < tokens.size(1); p += chunk) {
    const int64_t n = std::min(chunk, tokens.size(1) - p);
    parts.push_back(m.forward_cached(tokens.narrow(1, p, n), cache));
    EXPECT_EQ(cache.length(), p + n);
  }
  return runtime::cat(parts, 1);
}

void check_incremental_matches_full(DType dtype, double tol, bool spread) {
  auto m = tiny_model(dtype, 7, spread);
  Tensor tokens = runtime::from_vector<int64_t>(random_ids(2 * 16, 50, 3), {2, 16}, kI64);
  Tensor full = (*m)(tokens);
  // One token per step after a prompt of 5, and a mix of chunk sizes; a prefill of 1.
  Tensor steps = incremental_logits(*m, tokens, 5, 1);
  ASSERT_EQ(steps.shape(), (Shape{2, 16, 50}));
  EXPECT_EQ(steps.dtype(), full.dtype());
  EXPECT_TRUE(all_close(steps, full, tol, 0));
  EXPECT_TRUE(all_close(incremental_logits(*m, tokens, 1, 3), full, tol, 0));
  // The whole sequence as a prefill is the full forward.
  EXPECT_TRUE(all_close(incremental_logits(*m, tokens, 16, 1), full, tol, 0));
}

TEST(KVCache, IncrementalLogitsEqualFullForwardF32) {
  check_incremental_matches_full(DType::F32, 1e-5, /*spread=*/false);
}

TEST(KVCache, IncrementalLogitsEqualFullForwardF64) {
  check_incremental_matches_full(DType::F64, 1e-12, /*spread=*/false);
  check_incremental_matches_full(DType::F64, 1e-12, /*spread=*/true);
}

TEST(KVCache, HoldsTheRotatedKeysAndRecordsNoGraph) {
  auto m = tiny_model(DType::F64);
  KVCache cache = m->make_kv_cache(1);
  EXPECT_EQ(cache.dtype(), DType::F64);
  EXPECT_EQ(cache.keys(1).shape(), (Shape{1, 2, 16, 4}));
  Tensor tokens = runtime::from_vector<int64_t>(random_ids(4, 50, 5), {1, 4}, kI64);
  Tensor logits = m->forward_cached(tokens, cache);
  EXPECT_FALSE(logits.requires_grad());
  EXPECT_TRUE(runtime::GradMode::enabled());
  EXPECT_EQ(cache.length(), 4);
  // Filled positions are non-zero, the rest still zero.
  auto k = cache.keys(0).select(0, 0).select(0, 0).to_vector<double>();  // [16, 4]
  double filled = 0, rest = 0;
  for (size_t i = 0; i < k.size(); ++i) (i < 16 ? filled : rest) += std::abs(k[i]);
  EXPECT_GT(filled, 0);
  EXPECT_EQ(rest, 0);
  cache.reset();
  EXPECT_EQ(cache.length(), 0);
}

TEST(KVCache, ErrorsLeaveTheCacheUnchanged) {
  auto m = tiny_model(DType::F32, 7, /*spread=*/false);
  KVCache cache = m->make_kv_cache(1);
  Tensor ten = runtime::from_vector<int64_t>(random_ids(10, 50, 1), {1, 10}, kI64);
  m->forward_cached(ten, cache);
  try {
    m->forward_cached(ten, cache);  // 10 + 10 > 16
    FAIL() << "expected an error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("10 cached + 10 new tokens exceed the cache's max_seq 16"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cache.length(), 10);
  // An out-of-range token fails inside the forward: nothing is committed.
  Tensor bad = runtime::full({1, 1}, 50, kI64);
  EXPECT_THROW(m->forward_cached(bad, cache), mt::Error);
  EXPECT_EQ(cache.length(), 10);
  Tensor two_rows = runtime::from_vector<int64_t>({1, 2}, {2, 1}, kI64);
  EXPECT_THROW(m->forward_cached(two_rows, cache), mt::Error);  // batch 2 vs cache batch 1
  EXPECT_EQ(cache.length(), 10);
  // The cache still works: the next token's logits match the full forward's.
  Tensor next = runtime::from_vector<int64_t>({7}, {1, 1}, kI64);
  Tensor step = m->forward_cached(next, cache);
  Tensor full = (*m)(runtime::cat({ten, next}, 1));
  EXPECT_TRUE(all_close(step, full.narrow(1, 10, 1), 1e-5, 0));
  // Direct misuse of the cache.
  EXPECT_THROW(KVCache(tiny_args(), 1, {}, 17), mt::Error);
  EXPECT_THROW(cache.keys(2), mt::Error);
  Tensor kv = runtime::zeros({1, 2, 1, 4});
  cache.append(0, kv, kv);
  EXPECT_THROW(cache.append(0, kv, kv), mt::Error);  // twice without advance
  EXPECT_THROW(cache.advance(1), mt::Error);         // layer 1 did not append
  cache.discard_pending();
  EXPECT_THROW(cache.append(1, runtime::zeros({1, 2, 1, 3}), kv), mt::Error);
}

// truncate() forgets tokens a forward ran with (the padding of a sequence-parallel step): the
// next forward writes over them and its logits are the full forward's on the real tokens.
TEST(KVCache, TruncatedTokensAreWrittenOverByTheNextForward) {
  auto m = tiny_model(DType::F64);
  const Tensor tokens = runtime::from_vector<int64_t>(random_ids(9, 50, 11), {1, 9}, kI64);
  const Tensor full = (*m)(tokens);
  KVCache cache = m->make_kv_cache(1);
  const Tensor junk = runtime::from_vector<int64_t>({3, 1, 4}, {1, 3}, kI64);
  m->forward_cached(runtime::cat({tokens.narrow(1, 0, 5), junk}, 1), cache);
  EXPECT_EQ(cache.length(), 8);
  cache.truncate(5);
  EXPECT_EQ(cache.length(), 5);
  EXPECT_TRUE(all_close(m->forward_cached(tokens.narrow(1, 5, 4), cache), full.narrow(1, 5, 4),
                        1e-12, 0));
  EXPECT_THROW(cache.truncate(10), mt::Error);  // beyond what it holds
}

// Argmax of the last row of the full forward, recomputed on the whole sequence each step.
std::vector<int64_t> naive_greedy(Transformer& m, std::vector<int64_t> seq, int64_t n) {
  runtime::NoGradGuard no_grad;
  std::vector<int64_t> out;
  for (int64_t s = 0; s < n; ++s) {
    Tensor logits = m(runtime::from_vector<int64_t>(seq, {1, int64_t(seq.size())}, kI64));
    auto row = logits.select(1, int64_t(seq.size()) - 1).to_vector<double>();
    int64_t best = 0;
    for (size_t i = 1; i < row.size(); ++i) best = row[i] > row[size_t(best)] ? int64_t(i) : best;
    out.push_back(best);
    seq.push_back(best);
  }
  return out;
}

TEST(Generate, GreedyEqualsNaiveArgmaxOfFullForward) {
  for (DType dt : {DType::F64, DType::F32}) {
    auto m = tiny_model(dt, 11);
    const std::vector<int64_t> prompt = random_ids(4, 50, 9);
    GenerateResult r = generate(*m, prompt, {.max_new_tokens = 10});
    EXPECT_EQ(r.stop_reason, StopReason::MaxNewTokens);
    EXPECT_EQ(r.tokens, naive_greedy(*m, prompt, 10)) << runtime::dtype_name(dt);
    // Not a degenerate repetition of one token.
    EXPECT_GT(std::set<int64_t>(r.tokens.begin(), r.tokens.end()).size(), 3u);
  }
}

TEST(Generate, TopK1EqualsGreedy) {
  auto m = tiny_model(DType::F32, 12);
  const std::vector<int64_t> prompt = random_ids(3, 50, 4);
  GenerateResult greedy = generate(*m, prompt, {.max_new_tokens = 12});
  for (uint64_t seed : {1, 2, 3}) {
    GenerateResult r =
        generate(*m, prompt, {.max_new_tokens = 12, .temperature = 1.5, .top_k = 1, .seed = seed});
    EXPECT_EQ(r.tokens, greedy.tokens) << seed;
  }
}

TEST(Generate, SameSeedSameSampleOtherSeedOtherSample) {
  auto m = tiny_model(DType::F32, 13);
  const std::vector<int64_t> prompt = random_ids(2, 50, 8);
  auto sample = [&](uint64_t seed) {
    return generate(*m, prompt, {.max_new_tokens = 14, .temperature = 1.0, .seed = seed}).tokens;
  };
  const auto a = sample(5);
  EXPECT_EQ(a.size(), 14u);
  EXPECT_EQ(sample(5), a);
  EXPECT_NE(sample(6), a);
  // Temperature sampling differs from greedy on an untrained model (logits of std ~1).
  EXPECT_NE(generate(*m, prompt, {.max_new_tokens = 14}).tokens, a);
}

TEST(Generate, SampleNextTokenFollowsSoftmaxAndTopK) {
  // Frequencies over 20000 draws against softmax(logits / T), and the top-2 renormalised.
  const std::vector<double> logits{0.5, 2.0, -1.0, 1.0, 1.9};
  Tensor x = runtime::from_vector<double>(logits, {5});
  const double temperature = 0.7;
  auto expected = [&](std::vector<int> allowed) {
    std::vector<double> p(logits.size(), 0.0);
    double z = 0;
    for (int i : allowed) z += p[size_t(i)] = std::exp(logits[size_t(i)] / temperature);
    for (double& v : p) v /= z;
    return p;
  };
  const int n = 20000;
  for (int64_t top_k : {0, 2, 5, 9}) {
    std::vector<double> freq(logits.size(), 0.0);
    runtime::RandomKey key(17, "generate");
    for (int s = 0; s < n; ++s) freq[size_t(sample_next_token(x, temperature, top_k, key, s))] += 1;
    const auto p = top_k == 2 ? expected({1, 4}) : expected({0, 1, 2, 3, 4});
    for (size_t i = 0; i < p.size(); ++i) {
      // 5 standard deviations of a binomial proportion.
      EXPECT_NEAR(freq[i] / n, p[i], 5 * std::sqrt(p[i] * (1 - p[i]) / n) + 1e-12)
          << "top_k " << top_k << " id " << i;
    }
  }
  // Greedy: the argmax, the lowest id on ties.
  Tensor tie = runtime::from_vector<double>({0.0, 3.0, 1.0, 3.0}, {4});
  EXPECT_EQ(sample_next_token(tie, 0.0, 0, {}, 0), 1);
  EXPECT_EQ(sample_next_token(tie, 1.0, 1, {}, 0), 1);
  Tensor nan = runtime::from_vector<double>({0.0, std::nan("")}, {2});
  EXPECT_THROW(sample_next_token(nan, 1.0, 0, {}, 0), mt::Error);
  EXPECT_THROW(sample_next_token(runtime::zeros({2, 3}), 1.0, 0, {}, 0), mt::Error);
}

TEST(Generate, StopsAtEosIncludingIt) {
  auto m = tiny_model(DType::F32, 14);
  const std::vector<int64_t> prompt = random_ids(3, 50, 2);
  const auto all = generate(*m, prompt, {.max_new_tokens = 10}).tokens;
  ASSERT_EQ(all.size(), 10u);
  const int64_t eos = all[4];
  size_t first = 0;
  while (all[first] != eos) ++first;
  GenerateResult r = generate(*m, prompt, {.max_new_tokens = 10, .eos_id = eos});
  EXPECT_EQ(r.stop_reason, StopReason::Eos);
  EXPECT_EQ(r.tokens, std::vector<int64_t>(all.begin(), all.begin() + long(first) + 1));
  EXPECT_EQ(std::string(stop_reason_name(r.stop_reason)), "eos");
}

TEST(Generate, AgreeOnTokenDecidesWhatIsFedBackAndReturned) {
  auto m = tiny_model(DType::F32, 16);
  const std::vector<int64_t> prompt = random_ids(3, 50, 5);
  const auto own = generate(*m, prompt, {.max_new_tokens = 6}).tokens;
  // An agreement that keeps the sampled token changes nothing, and sees every sampled token.
  std::vector<int64_t> seen;
  GenerateOptions keep{.max_new_tokens = 6};
  keep.agree_on_token = [&](int64_t t) {
    seen.push_back(t);
    return t;
  };
  EXPECT_EQ(generate(*m, prompt, keep).tokens, own);
  EXPECT_EQ(seen, own);
  // Another rank's choice (here: the next id) is what the model is fed: from the second token
  // on, what it samples follows the forced history, as a plain run on that history does.
  GenerateOptions shift{.max_new_tokens = 6};
  std::vector<int64_t> sampled;
  shift.agree_on_token = [&](int64_t t) {
    sampled.push_back(t);
    return (t + 1) % 50;
  };
  const auto forced = generate(*m, prompt, shift).tokens;
  ASSERT_EQ(forced.size(), 6u);
  for (size_t i = 0; i < forced.size(); ++i) EXPECT_EQ(forced[i], (sampled[i] + 1) % 50) << i;
  std::vector<int64_t> history = prompt;
  history.push_back(forced[0]);
  EXPECT_EQ(generate(*m, history, {.max_new_tokens = 1}).tokens[0], sampled[1]);
  // An agreed EOS stops generation on every rank, whatever this one sampled.
  GenerateOptions stop{.max_new_tokens = 6, .eos_id = 49};
  stop.agree_on_token = [](int64_t) { return int64_t(49); };
  GenerateResult r = generate(*m, prompt, stop);
  EXPECT_EQ(r.tokens, std::vector<int64_t>{49});
  EXPECT_EQ(r.stop_reason, StopReason::Eos);
  // A token outside the vocabulary is an error, not an out-of-range embedding read.
  GenerateOptions bad{.max_new_tokens = 2};
  bad.agree_on_token = [](int64_t) { return int64_t(50); };
  EXPECT_THROW(generate(*m, prompt, bad), mt::Error);
}

// A model whose vocab is padded past the tokenizer's returns wider logits: the padded ids are
// never sampled, even where their logits are the largest, and the rest is sampled as from the
// tokenizer's columns alone.
TEST(Generate, PaddedVocabIdsAreNeverSampled) {
  const int64_t tokenizer_vocab = 40, padded_vocab = 48;
  const runtime::Device cpu = runtime::Device::cpu();
  const auto logits_for = [&](const Tensor& tokens) {  // the padded ids lead by far
    std::vector<float> v(size_t(padded_vocab), 0.0f);
    const int64_t last = tokens.to_vector<int64_t>().back();
    for (int64_t i = 0; i < tokenizer_vocab; ++i) v[size_t(i)] = float((i * 7 + last) % 13);
    for (int64_t i = tokenizer_vocab; i < padded_vocab; ++i) v[size_t(i)] = 100.0f;
    return runtime::from_vector<float>(v, {padded_vocab});
  };
  const DecodeStep step = [&](const Tensor& tokens) { return logits_for(tokens); };
  const DecodeStep narrowed = [&](const Tensor& tokens) {
    return logits_for(tokens).narrow(0, 0, tokenizer_vocab).contiguous();
  };
  const DecodeLimits limits{tokenizer_vocab, 64};
  for (const GenerateOptions& options :
       {GenerateOptions{.max_new_tokens = 20},
        GenerateOptions{.max_new_tokens = 20, .temperature = 1.0, .top_k = 0, .seed = 3}}) {
    const auto tokens = generate(limits, cpu, step, {1, 2, 3}, options).tokens;
    ASSERT_EQ(tokens.size(), 20u);
    for (int64_t t : tokens) EXPECT_LT(t, tokenizer_vocab);
    EXPECT_EQ(tokens, generate(limits, cpu, narrowed, {1, 2, 3}, options).tokens);
  }
}

TEST(Generate, StopsAtMaxSeqLenAndMaxNewTokens) {
  auto m = tiny_model(DType::F32, 15);
  GenerateResult r = generate(*m, random_ids(13, 50, 1), {.max_new_tokens = 10});
  EXPECT_EQ(r.tokens.size(), 3u);  // 13 + 3 = max_seq_len 16
  EXPECT_EQ(r.stop_reason, StopReason::MaxSeqLen);
  r = generate(*m, random_ids(16, 50, 1), {.max_new_tokens = 10});
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(r.stop_reason, StopReason::MaxSeqLen);
  r = generate(*m, random_ids(13, 50, 1), {.max_new_tokens = 3});
  EXPECT_EQ(r.tokens.size(), 3u);
  EXPECT_EQ(r.stop_reason, StopReason::MaxNewTokens);
  r = generate(*m, random_ids(2, 50, 1), {.max_new_tokens = 0});
  EXPECT_TRUE(r.tokens.empty());
}

TEST(Generate, BadArgumentsAreErrors) {
  auto m = tiny_model(DType::F32);
  const std::vector<int64_t> prompt{1, 2, 3};
  try {
    generate(*m, random_ids(17, 50, 1), {});
    FAIL() << "expected an error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt of 17 tokens is longer than the model's "
                                         "max_seq_len = 16"),
              std::string::npos)
        << e.what();
  }
  try {
    generate(*m, prompt, {.temperature = -0.5});
    FAIL() << "expected an error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("temperature >= 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(generate(*m, prompt, {.top_k = -1}), mt::Error);
  EXPECT_THROW(generate(*m, prompt, {.temperature = std::nan("")}), mt::Error);
  EXPECT_THROW(generate(*m, prompt, {.max_new_tokens = -1}), mt::Error);
  EXPECT_THROW(generate(*m, {}, {}), mt::Error);
  EXPECT_THROW(generate(*m, {1, 50}, {}), mt::Error);
  EXPECT_THROW(generate(*m, prompt, {.eos_id = 50}), mt::Error);
}

// The stages of a pipeline (tiny_args' 2 layers, one per stage: models built from the same seed
// hold the whole model's values by FQN) decode through generate's DecodeStep overload, each
// stage with a cache of its own layer, to the whole model's logits bitwise (the same ops in the
// same order) and its tokens, greedy and sampled.
TEST(Generate, PipelineStagesDecodeAsTheWholeModel) {
  auto whole = tiny_model(DType::F32, 21);
  auto first = tiny_model(DType::F32, 21, true, {0, 1});
  auto last = tiny_model(DType::F32, 21, true, {1, 2});
  KVCache first_cache = first->make_kv_cache(1), last_cache = last->make_kv_cache(1);
  EXPECT_EQ(first_cache.first_layer(), 0);
  EXPECT_EQ(first_cache.n_layers(), 1);
  EXPECT_EQ(last_cache.first_layer(), 1);
  EXPECT_EQ(last_cache.n_layers(), 1);
  EXPECT_THROW(last_cache.keys(0), mt::Error);  // not its layer

  const std::vector<int64_t> prompt = random_ids(5, 50, 6);
  const Tensor tokens = runtime::from_vector<int64_t>(prompt, {1, 5}, kI64);
  KVCache whole_cache = whole->make_kv_cache(1);
  const Tensor want = whole->forward_cached(tokens, whole_cache);
  const Tensor hidden = first->forward_cached(tokens, first_cache);
  EXPECT_EQ(hidden.shape(), (Shape{1, 5, 16}));
  const Tensor got = last->forward_cached(hidden, last_cache);
  EXPECT_TRUE(all_close(got, want, 0, 0));
  // A stage's cache does not fit the other stage (errors name the layers), nor a token input
  // the stage without embeddings.
  try {
    first->forward_cached(tokens, last_cache);
    FAIL() << "expected an error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cache of layers [1, 2)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(last->forward_cached(tokens, last_cache), mt::Error);
  EXPECT_EQ(last_cache.length(), 5);
  // The whole-model generate needs the whole model.
  EXPECT_THROW(generate(*first, prompt, {}), mt::Error);

  for (const GenerateOptions& options :
       {GenerateOptions{.max_new_tokens = 8}, GenerateOptions{.max_new_tokens = 8,
                                                              .temperature = 1.0, .seed = 4}}) {
    KVCache c0 = first->make_kv_cache(1), c1 = last->make_kv_cache(1);
    const DecodeStep step = [&](const Tensor& t) {
      const Tensor logits = last->forward_cached(first->forward_cached(t, c0), c1);
      return logits.select(0, 0).select(0, logits.size(1) - 1);
    };
    const GenerateResult staged = generate(kTinyLimits, runtime::Device{}, step, prompt, options);
    EXPECT_EQ(staged.tokens, generate(*whole, prompt, options).tokens);
    EXPECT_EQ(staged.tokens.size(), 8u);
    EXPECT_EQ(c1.length(), 5 + 7);  // the last token is not fed back
  }
}

// A rank without the last stage has no logits: its token comes from agree_on_token (called with
// -1), and without one that is an error.
TEST(Generate, RankWithoutLogitsTakesTheAgreedToken) {
  const DecodeStep no_logits = [](const Tensor&) { return Tensor(); };
  const std::vector<int64_t> agreed{3, 9, 4};
  std::vector<int64_t> asked;
  GenerateOptions options{.max_new_tokens = 3};
  options.agree_on_token = [&](int64_t t) {
    asked.push_back(t);
    return agreed[asked.size() - 1];
  };
  const GenerateResult r = generate(kTinyLimits, runtime::Device{}, no_logits, {1, 2}, options);
  EXPECT_EQ(r.tokens, agreed);
  EXPECT_EQ(asked, (std::vector<int64_t>{-1, -1, -1}));
  try {
    generate(kTinyLimits, runtime::Device{}, no_logits, {1, 2}, {.max_new_tokens = 3});
    FAIL() << "expected an error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no agree_on_token"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::models::llama
