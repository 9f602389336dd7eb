// models/llama: FQNs, shapes, loss at init, f64 gradcheck of the whole tiny model, causality,
// activation checkpointing, init determinism and statistics, flavor sizes, and the registry.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <any>
#include <cmath>
#include <string>
#include <vector>

#include "models/llama/model.h"
#include "models/llama/model_args.h"
#include "models/registry.h"
#include "runtime/autograd/gradcheck.h"
#include "runtime/core/grad_mode.h"
#include "runtime/core/profiler.h"
#include "runtime/core/rng.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "tests/testing/tensor_testing.h"

namespace mt::models::llama {
namespace {

using runtime::DType;
using runtime::Shape;
using testing::all_close;

ModelArgs tiny_args(int64_t layers = 2) {
  ModelArgs a;
  a.dim = 16;
  a.n_layers = layers;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.vocab_size = 37;
  a.multiple_of = 8;
  a.max_seq_len = 16;
  return a;
}

// Tokens [b, t] in [0, vocab), drawn from the counter-based RNG.
Tensor random_tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v(size_t(b * t));
  runtime::RandomKey key(seed, "tokens");
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(runtime::uniform_at(key, i) * double(vocab));
  return runtime::from_vector<int64_t>(v, {b, t}, TensorOptions{}.with_dtype(DType::I64));
}

std::vector<std::string> names(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> out;
  for (const auto& [k, t] : v) out.push_back(k);
  return out;
}

double stddev(const Tensor& t) {
  auto v = t.to_vector<double>();
  double s = 0, s2 = 0;
  for (double x : v) s += x, s2 += x * x;
  const double m = s / double(v.size());
  return std::sqrt(s2 / double(v.size()) - m * m);
}

TEST(Llama, FqnsOfTwoLayerModelMatchTorchtitan) {
  Transformer model(tiny_args(2));
  std::vector<std::string> expected{"tok_embeddings.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    for (const char* s : {"attention.wq.weight", "attention.wk.weight", "attention.wv.weight",
                          "attention.wo.weight", "feed_forward.w1.weight", "feed_forward.w2.weight",
                          "feed_forward.w3.weight", "attention_norm.weight", "ffn_norm.weight"}) {
      expected.push_back(p + s);
    }
  }
  expected.push_back("norm.weight");
  expected.push_back("output.weight");
  EXPECT_EQ(names(model.named_parameters()), expected);
  // RoPE tables are non-persistent: not in the state dict.
  EXPECT_EQ(model.state_dict().size(), expected.size());
}

TEST(Llama, ParameterShapes) {
  ModelArgs a = tiny_args(1);
  Transformer model(a);
  const int64_t hidden = a.ffn_hidden_dim();  // int(2*64/3)=42 -> 48
  EXPECT_EQ(hidden, 48);
  EXPECT_EQ(model.slot("layers.0.attention.wq.weight").shape(), (Shape{16, 16}));
  EXPECT_EQ(model.slot("layers.0.attention.wk.weight").shape(), (Shape{8, 16}));
  EXPECT_EQ(model.slot("layers.0.attention.wv.weight").shape(), (Shape{8, 16}));
  EXPECT_EQ(model.slot("layers.0.attention.wo.weight").shape(), (Shape{16, 16}));
  EXPECT_EQ(model.slot("layers.0.feed_forward.w1.weight").shape(), (Shape{48, 16}));
  EXPECT_EQ(model.slot("layers.0.feed_forward.w2.weight").shape(), (Shape{16, 48}));
  EXPECT_EQ(model.slot("tok_embeddings.weight").shape(), (Shape{37, 16}));
  EXPECT_EQ(model.slot("output.weight").shape(), (Shape{37, 16}));
  Tensor logits = model(random_tokens(2, 5, a.vocab_size, 1));
  EXPECT_EQ(logits.shape(), (Shape{2, 5, 37}));
  EXPECT_EQ(logits.dtype(), DType::F32);
  // Too long a sequence and an out-of-range token are errors with a message.
  EXPECT_THROW(model(random_tokens(1, 17, a.vocab_size, 1)), mt::Error);
  try {
    model(random_tokens(1, 17, a.vocab_size, 1));
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_seq_len = 16"), std::string::npos) << e.what();
  }
  Tensor bad = runtime::full({1, 3}, 37, TensorOptions{}.with_dtype(DType::I64));
  EXPECT_THROW(model(bad), mt::Error);
}

TEST(Llama, ForwardBackwardLossNearLogVocabAtInit) {
  ModelArgs a = tiny_args(2);
  a.vocab_size = 257;
  Transformer model(a, /*seed=*/3);
  Tensor tokens = random_tokens(4, 16, a.vocab_size, 5);
  Tensor targets = random_tokens(4, 16, a.vocab_size, 6);
  Tensor loss = runtime::cross_entropy(model(tokens), targets);
  const double l = loss.item<double>();
  // Output std dim^-0.5 on unit-RMS features: logits of std ~1, loss ~ log V + 1/2.
  EXPECT_NEAR(l, std::log(257.0), 1.0);
  loss.backward();
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().shape(), p.shape()) << name;
    double n2 = 0;
    for (double g : p.grad().to_vector<double>()) n2 += g * g;
    EXPECT_TRUE(std::isfinite(n2) && n2 > 0) << name;
  }
}

// The smallest model gradcheck can afford in f64: dim 8, 1 layer, 2 heads sharing 1 kv head.
ModelArgs gradcheck_args() {
  ModelArgs a;
  a.dim = 8;
  a.n_layers = 1;
  a.n_heads = 2;
  a.n_kv_heads = 1;
  a.vocab_size = 11;
  a.multiple_of = 4;
  a.max_seq_len = 4;
  return a;
}

TEST(Llama, GradcheckWholeTinyModelF64) {
  ModelArgs a = gradcheck_args();
  auto model = std::make_shared<Transformer>(a, /*seed=*/7);
  model->to(DType::F64);
  Tensor tokens = random_tokens(2, 4, a.vocab_size, 9);
  std::vector<Tensor> params;
  for (const char* fqn : {"layers.0.attention.wk.weight", "layers.0.attention.wq.weight",
                          "layers.0.feed_forward.w3.weight", "layers.0.attention_norm.weight",
                          "tok_embeddings.weight"}) {
    Tensor p = model->slot(fqn);
    ASSERT_EQ(p.dtype(), DType::F64) << fqn;
    ASSERT_TRUE(p.requires_grad()) << fqn;
    params.push_back(p);
  }
  auto r = runtime::autograd::gradcheck(
      [model, tokens](const std::vector<Tensor>&) { return (*model)(tokens); }, params);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Llama, GradcheckTiedTableF64) {
  // The tied table receives the embedding's and the output projection's gradients.
  ModelArgs a = gradcheck_args();
  a.tie_embeddings = true;
  auto model = std::make_shared<Transformer>(a, /*seed=*/8);
  model->to(DType::F64);
  ASSERT_TRUE(model->output->weight.same(model->tok_embeddings->weight));
  Tensor tokens = random_tokens(1, 4, a.vocab_size, 10);
  auto r = runtime::autograd::gradcheck(
      [model, tokens](const std::vector<Tensor>&) { return (*model)(tokens); },
      {model->slot("tok_embeddings.weight")});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Llama, CausalFutureTokensDoNotChangeEarlierLogits) {
  ModelArgs a = tiny_args(2);
  Transformer model(a, 11);
  runtime::NoGradGuard no_grad;
  Tensor tokens = random_tokens(1, 8, a.vocab_size, 12);
  auto v = tokens.to_vector<int64_t>();
  v[5] = (v[5] + 1) % a.vocab_size;
  Tensor changed = runtime::from_vector<int64_t>(v, {1, 8}, TensorOptions{}.with_dtype(DType::I64));
  Tensor l0 = model(tokens), l1 = model(changed);
  EXPECT_TRUE(all_close(l0.narrow(1, 0, 5), l1.narrow(1, 0, 5), 0, 0));  // bitwise
  EXPECT_FALSE(all_close(l0.narrow(1, 5, 1), l1.narrow(1, 5, 1), 1e-6, 0));
}

// The matmul and attention forward kernels one backward runs: the gradients' own, plus the
// forward ops that checkpointed blocks recompute.
struct BackwardKernels {
  int64_t matmuls = 0, attention_forwards = 0;
};
BackwardKernels backward_kernels(const Tensor& loss) {
  runtime::Profiler::start(runtime::Device::cpu());
  loss.backward();
  const runtime::ProfileReport report = runtime::Profiler::stop();
  BackwardKernels k;
  for (const runtime::ProfiledOp& op : report.ops) {
    if (op.depth != 0) continue;
    k.matmuls += std::string(op.name) == "matmul";
    k.attention_forwards += std::string(op.name) == "scaled_dot_product_attention";
  }
  return k;
}

// Full, selective (every second block, torchtitan's count: blocks 1 and 3 of 4) and op-level
// checkpointing recompute exactly: the same loss and gradients, bitwise. Each recomputes what it
// says in backward: a block's 5 matmuls (on the CPU q, k and v are one) and its attention, or,
// by op, only the 2nd and 4th matmul of every block (wo, w3) and no attention.
TEST(Llama, ActivationCheckpointingGivesIdenticalGradients) {
  ModelArgs a = tiny_args(4);
  Tensor tokens = random_tokens(2, 8, a.vocab_size, 21);
  Tensor targets = random_tokens(2, 8, a.vocab_size, 22);
  Transformer plain(a, 5);
  Tensor l0 = runtime::cross_entropy(plain(tokens), targets);
  const BackwardKernels k0 = backward_kernels(l0);
  EXPECT_EQ(k0.attention_forwards, 0);
  const auto p0 = plain.named_parameters();
  struct Case {
    std::string spec;
    std::vector<bool> checkpointed;
    int64_t recomputed_matmuls, recomputed_attention;
  };
  const std::vector<Case> cases = {{"full", {true, true, true, true}, 4 * 5, 4},
                                   {"selective:2", {false, true, false, true}, 2 * 5, 2},
                                   {"selective:op", {true, true, true, true}, 4 * 2, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    Transformer ckpt(a, 5);
    ckpt.set_activation_checkpointing(parse_activation_checkpointing(c.spec));
    std::vector<bool> checkpointed;
    for (const auto& block : ckpt.blocks) checkpointed.push_back(block->activation_checkpointing());
    EXPECT_EQ(checkpointed, c.checkpointed);
    Tensor l1 = runtime::cross_entropy(ckpt(tokens), targets);
    EXPECT_EQ(l0.item<double>(), l1.item<double>());
    const BackwardKernels k1 = backward_kernels(l1);
    EXPECT_EQ(k1.matmuls - k0.matmuls, c.recomputed_matmuls);
    EXPECT_EQ(k1.attention_forwards, c.recomputed_attention);
    EXPECT_EQ(testing::expect_same_gradients(ckpt.named_parameters(), p0), p0.size());
  }
  EXPECT_EQ(parse_activation_checkpointing("none").period, 0);
  EXPECT_EQ(parse_activation_checkpointing("selective:3").period, 3);
  EXPECT_FALSE(parse_activation_checkpointing("selective:3").keep_ops);
  EXPECT_TRUE(parse_activation_checkpointing("selective:op").keep_ops);
  for (const char* bad : {"selective", "selective:0", "selective:ops", "selective:2x", "partial"})
    EXPECT_THROW(parse_activation_checkpointing(bad), mt::Error) << bad;
}

TEST(Llama, InitIsIndependentOfThreadCount) {
  ModelArgs a = tiny_args(2);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  Transformer one(a, 42);
  omp_set_num_threads(4);
  Transformer four(a, 42);
  omp_set_num_threads(saved);
  Transformer other_seed(a, 43);
  auto s1 = one.named_parameters(), s4 = four.named_parameters();
  for (size_t i = 0; i < s1.size(); ++i) {
    EXPECT_TRUE(all_close(s4[i].second, s1[i].second, 0, 0)) << s1[i].first;
  }
  EXPECT_FALSE(all_close(other_seed.slot("layers.0.attention.wq.weight"),
                         one.slot("layers.0.attention.wq.weight"), 1e-6, 0));
  // Same name in a different layer: different values (keyed by FQN).
  EXPECT_FALSE(all_close(one.slot("layers.1.attention.wq.weight"),
                         one.slot("layers.0.attention.wq.weight"), 1e-6, 0));
}

TEST(Llama, InitStatisticsFollowTorchtitan) {
  ModelArgs a;
  a.dim = 128;
  a.n_layers = 2;
  a.n_heads = 4;
  a.vocab_size = 512;
  a.max_seq_len = 8;
  Transformer m(a, 1);
  const double tol = 0.05;  // relative; >= 16k samples per tensor
  EXPECT_NEAR(stddev(m.slot("tok_embeddings.weight")), 1.0, tol);
  EXPECT_NEAR(stddev(m.slot("layers.0.attention.wq.weight")) / 0.02, 1.0, tol);
  EXPECT_NEAR(stddev(m.slot("layers.1.feed_forward.w1.weight")) / 0.02, 1.0, tol);
  EXPECT_NEAR(stddev(m.slot("layers.0.attention.wo.weight")) / (0.02 / std::sqrt(2.0)), 1.0, tol);
  EXPECT_NEAR(stddev(m.slot("layers.1.attention.wo.weight")) / (0.02 / 2.0), 1.0, tol);
  EXPECT_NEAR(stddev(m.slot("layers.1.feed_forward.w2.weight")) / (0.02 / 2.0), 1.0, tol);
  EXPECT_NEAR(stddev(m.slot("layers.1.feed_forward.w3.weight")) / (0.02 / 2.0), 1.0, tol);
  // Output: trunc_normal(0, s, [-3s, 3s]), s = dim^-0.5; truncation shrinks the std to 0.9866 s.
  const double s = 1.0 / std::sqrt(128.0);
  Tensor out = m.slot("output.weight");
  EXPECT_NEAR(stddev(out) / (0.98658 * s), 1.0, tol);
  for (double x : out.to_vector<double>()) ASSERT_LE(std::abs(x), 3 * s + 1e-7);
  for (double x : m.slot("norm.weight").to_vector<double>()) ASSERT_EQ(x, 1.0);
  for (double x : m.slot("layers.1.ffn_norm.weight").to_vector<double>()) ASSERT_EQ(x, 1.0);
}

TEST(Llama, TiedEmbeddingsShareOneTable) {
  ModelArgs a = tiny_args(1);
  a.tie_embeddings = true;
  Transformer m(a, 2);
  EXPECT_TRUE(m.output->weight.same(m.tok_embeddings->weight));
  auto n = names(m.named_parameters());
  EXPECT_EQ(std::count(n.begin(), n.end(), "output.weight"), 0);
  EXPECT_EQ(n.front(), "tok_embeddings.weight");
  int64_t total = 0;
  for (const auto& [k, p] : m.named_parameters()) total += p.numel();
  EXPECT_EQ(total, count_parameters(a).total);
  // The tied table gets the output init (std dim^-0.5, truncated at 3 std).
  const double s = 0.25;
  for (double x : m.tok_embeddings->weight.to_vector<double>()) ASSERT_LE(std::abs(x), 3 * s);
}

TEST(Llama, FlavorParameterCountsMatchPublishedModels) {
  // Llama 3.1 8B: 8,030,261,248 parameters; Llama 3.2 1B: 1,235,814,400 (tied embedding).
  EXPECT_EQ(count_parameters(flavor_args("8B")).total, 8030261248);
  EXPECT_EQ(count_parameters(flavor_args("1B")).total, 1235814400);
  EXPECT_EQ(flavor_args("8B").ffn_hidden_dim(), 14336);
  EXPECT_EQ(flavor_args("1B").ffn_hidden_dim(), 8192);
  EXPECT_EQ(flavor_args("3B").ffn_hidden_dim(), 8192);
  EXPECT_EQ(flavor_args("70B").ffn_hidden_dim(), 28672);
  EXPECT_EQ(flavor_args("405B").ffn_hidden_dim(), 53248);
  EXPECT_NEAR(double(count_parameters(flavor_args("3B")).total), 3.21e9, 0.01e9);
  EXPECT_NEAR(double(count_parameters(flavor_args("70B")).total), 70.55e9, 0.01e9);
  EXPECT_NEAR(double(count_parameters(flavor_args("405B")).total), 405.85e9, 0.01e9);
  // FLOPs/token: 6 * (N - embedding) + 12 * L * H * Dh * T.
  const ModelArgs a8 = flavor_args("8B");
  const ParamCounts c = count_parameters(a8);
  EXPECT_DOUBLE_EQ(flops_per_token(a8, 8192),
                   6.0 * double(c.total - c.embedding) + 12.0 * 32 * 32 * 128 * 8192);
  // Tied: the output matmul still counts.
  const ModelArgs a1 = flavor_args("1B");
  EXPECT_DOUBLE_EQ(flops_per_token(a1, 2048),
                   6.0 * double(count_parameters(a1).total) + 12.0 * 16 * 32 * 64 * 2048);
  EXPECT_THROW(flavor_args("7B"), mt::Error);
}

TEST(Llama, DebugmodelBuiltParameterCountEqualsFormula) {
  ModelArgs a = flavor_args("debugmodel");
  EXPECT_EQ(a.dim, 256);
  EXPECT_EQ(a.n_layers, 6);
  EXPECT_EQ(a.n_heads, 16);
  a.max_seq_len = 8;
  Transformer m(a);
  int64_t total = 0;
  for (const auto& [k, p] : m.named_parameters()) total += p.numel();
  EXPECT_EQ(total, count_parameters(a).total);
}

TEST(Llama, BadArgsAreErrors) {
  ModelArgs a = tiny_args(1);
  a.n_kv_heads = 3;
  EXPECT_THROW(Transformer{a}, mt::Error);
  a = tiny_args(1);
  a.n_heads = 5;
  try {
    a.validate();
    FAIL() << "expected an error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by n_heads 5"), std::string::npos)
        << e.what();
  }
}

TEST(Registry, BuildsLlamaAndComputesLoss) {
  ModelSpec spec = get_model_spec("llama3", "debugmodel");
  EXPECT_EQ(spec.name, "llama3");
  EXPECT_TRUE(spec.parallelize);  // FSDP (models/llama/parallelize.cpp)
  auto& args = std::any_cast<ModelArgs&>(*spec.args);
  args = tiny_args(2);
  EXPECT_EQ(spec.num_params(), count_parameters(tiny_args(2)).total);
  EXPECT_DOUBLE_EQ(spec.flops_per_token(16), flops_per_token(tiny_args(2), 16));
  auto model = spec.build({.seed = 3, .activation_checkpoint = "full"});
  Transformer direct(tiny_args(2), 3);
  Tensor tokens = random_tokens(2, 6, 37, 1), targets = random_tokens(2, 6, 37, 2);
  Tensor l = spec.loss(*model, tokens, targets, runtime::Reduction::Mean);
  Tensor ref = runtime::cross_entropy(direct(tokens), targets);
  EXPECT_EQ(l.item<double>(), ref.item<double>());
  Tensor ls = spec.loss(*model, tokens, targets, runtime::Reduction::Sum);
  EXPECT_NEAR(ls.item<double>(), 12 * ref.item<double>(), 1e-4);
  EXPECT_EQ(spec.forward(*model, tokens).shape(), (Shape{2, 6, 37}));
  EXPECT_THROW(spec.build({.activation_checkpoint = "sometimes"}), mt::Error);
}

// The training loss of a bf16 model reads its bf16 logits (loss_logits) instead of the f32 cast
// that operator() returns: the loss (f32) and every gradient must be the cast path's, bitwise.
TEST(Registry, Bf16LossReadsBf16LogitsWithTheF32LogitsValues) {
  ModelSpec spec = get_model_spec("llama3", "debugmodel");
  std::any_cast<ModelArgs&>(*spec.args) = tiny_args(2);
  auto fused = spec.build({.seed = 3, .dtype = DType::BF16});
  auto cast = spec.build({.seed = 3, .dtype = DType::BF16});
  Tensor tokens = random_tokens(2, 6, 37, 1), targets = random_tokens(2, 6, 37, 2);
  const Tensor logits = spec.forward(*cast, tokens);  // operator(): f32 logits
  ASSERT_EQ(logits.dtype(), DType::F32);
  const Tensor want = runtime::cross_entropy(logits, targets);
  const Tensor got = spec.loss(*fused, tokens, targets, runtime::Reduction::Mean);
  ASSERT_EQ(got.dtype(), DType::F32);
  EXPECT_EQ(got.item<double>(), want.item<double>());
  got.backward();
  want.backward();
  const auto pc = cast->named_parameters();
  EXPECT_EQ(testing::expect_same_gradients(fused->named_parameters(), pc), pc.size());
}

TEST(Registry, UnknownNamesAndFlavorsListTheValidOnes) {
  EXPECT_EQ(model_names(), (std::vector<std::string>{"llama3", "deepseek_v3"}));
  EXPECT_EQ(model_flavors("llama3"),
            (std::vector<std::string>{"debugmodel", "1B", "3B", "8B", "70B", "405B"}));
  try {
    get_model_spec("gpt5", "debugmodel");
    FAIL() << "expected an error";
  } catch (const mt::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("unknown model name 'gpt5'; valid names: llama3, deepseek_v3"),
        std::string::npos)
        << e.what();
  }
  try {
    get_model_spec("llama3", "7B");
    FAIL() << "expected an error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid flavors: debugmodel, 1B, 3B, 8B, 70B, 405B"),
              std::string::npos)
        << e.what();
  }
  // 405B is described without allocating anything.
  ModelSpec big = get_model_spec("llama3", "405B");
  EXPECT_GT(big.num_params(), int64_t(400e9));
  EXPECT_GT(big.flops_per_token(8192), 6.0 * 400e9);
}

}  // namespace
}  // namespace mt::models::llama
