// nn::Module: FQNs, state_dict round trip and errors, to(DType), init keyed by FQN, hooks,
// zero_grad; and the Linear / Embedding / RMSNorm layers against naive references.
#include "runtime/nn/module.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "runtime/autograd/engine.h"
#include "runtime/core/grad_mode.h"
#include "runtime/nn/embedding.h"
#include "runtime/nn/linear.h"
#include "runtime/nn/rms_norm.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime::nn {
namespace {

using testing::all_close;
using testing::randn64;

TensorOptions f64() { return TensorOptions{}.with_dtype(DType::F64); }

class Block : public Module {
 public:
  explicit Block(int64_t d, TensorOptions opt = {}) : Module("Block") {
    norm = register_module("norm", std::make_shared<RMSNorm>(d, 1e-6, opt));
    wq = register_module("wq", std::make_shared<Linear>(d, d, false, opt));
  }
  Tensor operator()(const Tensor& x) {
    return call({x}, [this](const std::vector<Tensor>& in) { return (*wq)((*norm)(in[0])); });
  }
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<Linear> wq;
};

class Net : public Module {
 public:
  explicit Net(TensorOptions opt = {}) : Module("Net") {
    scale = full({1}, 2.0, opt);
    register_buffer("scale", scale);
    positions = arange(3);
    register_buffer("positions", positions, /*persistent=*/false);
    tok = register_module("tok_embeddings", std::make_shared<Embedding>(10, 4, opt));
    layers = register_module("layers", std::make_shared<ModuleList>());
    blocks.push_back(layers->push_back(std::make_shared<Block>(4, opt)));
    blocks.push_back(layers->push_back(std::make_shared<Block>(4, opt)));
    output = register_module("output", std::make_shared<Linear>(4, 10, true, opt));
  }
  Tensor operator()(const Tensor& ids) {
    return call({ids}, [this](const std::vector<Tensor>& in) {
      Tensor h = (*tok)(in[0]);
      for (auto& b : blocks) h = (*b)(h);
      return (*output)(mul(h, scale));
    });
  }
  Tensor scale, positions;
  std::shared_ptr<Embedding> tok;
  std::shared_ptr<ModuleList> layers;
  std::vector<std::shared_ptr<Block>> blocks;
  std::shared_ptr<Linear> output;
};

std::vector<std::string> keys_of(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> out;
  for (auto& [k, t] : v) out.push_back(k);
  return out;
}

TEST(Module, FullyQualifiedNamesInRegistrationOrder) {
  Net net;
  const std::vector<std::string> params{
      "tok_embeddings.weight", "layers.0.norm.weight", "layers.0.wq.weight", "layers.1.norm.weight",
      "layers.1.wq.weight",    "output.weight",        "output.bias"};
  EXPECT_EQ(keys_of(net.named_parameters()), params);
  EXPECT_EQ(net.parameters().size(), params.size());
  EXPECT_TRUE(net.parameters()[2].same(net.blocks[0]->wq->weight));
  EXPECT_EQ(keys_of(net.named_buffers()), (std::vector<std::string>{"scale", "positions"}));
  EXPECT_TRUE(net.named_parameters(/*recurse=*/false).empty());

  std::vector<std::string> modules;
  for (auto& [name, m] : net.named_modules()) modules.push_back(name + ":" + m->type_name());
  EXPECT_EQ(modules, (std::vector<std::string>{
                         ":Net", "tok_embeddings:Embedding", "layers:ModuleList", "layers.0:Block",
                         "layers.0.norm:RMSNorm", "layers.0.wq:Linear", "layers.1:Block",
                         "layers.1.norm:RMSNorm", "layers.1.wq:Linear", "output:Linear"}));

  // state_dict: params and persistent buffers, a module's own tensors before its children's.
  std::vector<std::string> expected{"scale"};
  expected.insert(expected.end(), params.begin(), params.end());
  EXPECT_EQ(net.state_dict().keys(), expected);
  for (const Tensor& p : net.parameters()) EXPECT_TRUE(p.requires_grad());
  EXPECT_FALSE(net.scale.requires_grad());
}

TEST(Module, SlotsCanBeSwappedByFqn) {
  Net net(f64());
  Tensor& slot = net.slot("layers.1.wq.weight");
  EXPECT_EQ(&slot, &net.blocks[1]->wq->weight);
  EXPECT_EQ(&net.submodule("layers.1.wq"), net.blocks[1]->wq.get());
  EXPECT_EQ(&net.submodule(""), &net);

  // A replaced tensor is what forward uses.
  Linear lin(3, 2, false, f64());
  const Tensor x = randn64({1, 3}, 1, false);
  lin.slot("weight") = zeros({2, 3}, f64().with_requires_grad(true));
  EXPECT_TRUE(all_close(lin(x), zeros({1, 2}, f64()), 0, 0));

  auto slots = net.named_parameter_slots();
  ASSERT_EQ(slots.size(), 7u);
  EXPECT_EQ(slots[2].fqn, "layers.0.wq.weight");
  EXPECT_EQ(slots[2].local_name, "weight");
  EXPECT_EQ(slots[2].owner, net.blocks[0]->wq.get());

  try {
    net.submodule("layers.0.nope");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no submodule 'layers.0.nope'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("has no child 'nope'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(net.slot("layers.0.wq.bias"), Error);
  EXPECT_THROW(net.slot("missing"), Error);
}

TEST(Module, RegistrationErrors) {
  Module m("M");
  Tensor a = zeros({2}), b = zeros({2}), ids = arange(3);
  m.register_parameter("a", a);
  EXPECT_THROW(m.register_parameter("a", b), Error);
  EXPECT_THROW(m.register_buffer("a", b), Error);
  EXPECT_THROW(m.register_parameter("x.y", b), Error);
  EXPECT_THROW(m.register_parameter("", b), Error);
  EXPECT_THROW(m.register_parameter("ids", ids), Error);  // integer params cannot require grad
  m.register_parameter("ids", ids, /*requires_grad=*/false);
}

TEST(Module, InitIsKeyedBySeedAndFqn) {
  Net a, b;
  a.init_weights(7);
  b.init_weights(7);
  for (auto& [name, t] : a.state_dict()) EXPECT_TRUE(all_close(t, b.state_dict().at(name), 0, 0));
  // Linear default: uniform in [-1/sqrt(in), 1/sqrt(in)) keyed by (seed, FQN).
  const Tensor expected =
      rand({4, 4}, RandomKey(7, "layers.1.wq.weight"), {}, -0.5, 0.5);  // in = 4
  EXPECT_TRUE(all_close(a.blocks[1]->wq->weight, expected, 0, 0));
  EXPECT_FALSE(all_close(a.blocks[0]->wq->weight, a.blocks[1]->wq->weight, 1e-3, 0));
  const Tensor emb = randn({10, 4}, RandomKey(7, "tok_embeddings.weight"));
  EXPECT_TRUE(all_close(a.tok->weight, emb, 0, 0));
  EXPECT_TRUE(all_close(a.blocks[0]->norm->weight, ones({4}), 0, 0));
  b.init_weights(8);
  EXPECT_FALSE(all_close(a.output->weight, b.output->weight, 1e-3, 0));
}

TEST(Module, InitHelpers) {
  // trunc_normal: within bounds, deterministic, slice of a larger draw equals the full draw's
  // block.
  Tensor full_t = empty({6, 8});
  init_trunc_normal_(full_t, RandomKey(3, "w"), 0.0, 0.02, -0.04, 0.04);
  for (double v : full_t.to_vector<double>()) {
    EXPECT_GE(v, -0.04);
    EXPECT_LE(v, 0.04);
  }
  Tensor block = empty({2, 3});
  init_trunc_normal_(block, RandomKey(3, "w"), 0.0, 0.02, -0.04, 0.04, {6, 8}, {4, 5});
  EXPECT_TRUE(all_close(block, full_t.slice(0, 4, 6).slice(1, 5, 8), 0, 0));
  // sample std of a truncated (at 2 std) normal is about 0.88 std.
  Tensor big = empty({20000}, f64());
  init_trunc_normal_(big, RandomKey(1, "big"), 0.0, 1.0, -2.0, 2.0);
  const auto v = big.to_vector<double>();
  double s = 0, s2 = 0;
  for (double x : v) s += x, s2 += x * x;
  const double mean = s / v.size(), var = s2 / v.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(std::sqrt(var), 0.8796, 0.02);
  EXPECT_NEAR(erfinv(std::erf(0.3)), 0.3, 1e-12);
  EXPECT_NEAR(erfinv(std::erf(-2.5)), -2.5, 1e-10);
  EXPECT_THROW(init_trunc_normal_(block, RandomKey(3, "w"), 0.0, 0.02, -0.04, 0.04, {6, 8}, {5, 5}),
               Error);
}

TEST(Module, StateDictRoundTrip) {
  Net a(f64()), b(f64());
  a.init_weights(1);
  b.init_weights(2);
  a.scale.fill_(3.0);
  const Tensor wb = b.output->weight;
  const uint64_t version = wb.version();
  b.load_state_dict(a.state_dict());
  for (auto& [name, t] : a.state_dict()) EXPECT_TRUE(all_close(b.state_dict().at(name), t, 0, 0));
  // Values were copied into b's own tensors.
  EXPECT_TRUE(b.output->weight.same(wb));
  EXPECT_GT(wb.version(), version);
  EXPECT_FALSE(b.output->weight.shares_storage_with(a.output->weight));
  EXPECT_TRUE(b.output->weight.requires_grad());
  // The state dict holds the module's tensors (not copies).
  EXPECT_TRUE(a.state_dict().at("output.bias").same(a.output->bias));
  // Same outputs.
  const Tensor ids =
      from_vector<int64_t>({1, 2, 3, 9}, {4}, TensorOptions{}.with_dtype(DType::I64));
  NoGradGuard no_grad;
  EXPECT_TRUE(all_close(a(ids), b(ids), 0, 0));
}

TEST(Module, LoadStateDictErrorsNameTheKeys) {
  Net net;
  StateDict sd = net.state_dict();
  StateDict bad;
  for (auto& [k, v] : sd)
    if (k != "layers.0.wq.weight") bad.insert(k, v);
  bad.insert("layers.0.wk.weight", zeros({4, 4}));
  try {
    net.load_state_dict(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("missing keys: 'layers.0.wq.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected keys: 'layers.0.wk.weight'"), std::string::npos) << msg;
  }
  // Non-strict accepts missing/unexpected keys and loads the rest.
  bad.set("output.bias", full({10}, 5.0));
  net.load_state_dict(bad, /*strict=*/false);
  EXPECT_TRUE(all_close(net.output->bias, full({10}, 5.0), 0, 0));

  StateDict shape = net.state_dict();
  shape.set("layers.1.wq.weight", zeros({4, 5}));
  const Tensor before = net.output->bias.clone();
  shape.set("output.bias", zeros({10}));
  try {
    net.load_state_dict(shape);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'layers.1.wq.weight': expected shape [4, 4] f32, found shape [4, 5] f32"),
              std::string::npos)
        << msg;
  }
  // Nothing was copied when a check failed.
  EXPECT_TRUE(all_close(net.output->bias, before, 0, 0));
  EXPECT_THROW(net.load_state_dict(shape, /*strict=*/false), Error);  // shapes always checked

  StateDict dtype = net.state_dict();
  dtype.set("scale", full({1}, 2.0, f64()));
  try {
    net.load_state_dict(dtype);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'scale': expected shape [1] f32, found shape [1] f64"),
              std::string::npos)
        << e.what();
  }
}

TEST(Module, ToDTypeConvertsFloatingTensorsOnly) {
  Net net;
  net.init_weights(3);
  const Tensor w_before = net.output->weight.clone();
  Tensor* slot = &net.output->weight;
  net.to(DType::BF16);
  EXPECT_EQ(slot, &net.output->weight);
  for (auto& [name, p] : net.named_parameters()) {
    EXPECT_EQ(p.dtype(), DType::BF16) << name;
    EXPECT_TRUE(p.requires_grad()) << name;
    EXPECT_TRUE(p.is_leaf()) << name;
  }
  EXPECT_EQ(net.scale.dtype(), DType::BF16);
  EXPECT_EQ(net.positions.dtype(), DType::I64);  // not floating: unchanged
  EXPECT_TRUE(all_close(net.output->weight, w_before, 0, 1.0 / 128));
  // A forward pass works in bf16 and backward reaches the new leaves.
  const Tensor ids = from_vector<int64_t>({0, 5}, {2}, TensorOptions{}.with_dtype(DType::I64));
  sum(net(ids)).backward();
  EXPECT_TRUE(net.output->weight.grad().defined());
  EXPECT_EQ(net.output->weight.grad().dtype(), DType::BF16);
  net.to(DType::F32);
  EXPECT_EQ(net.output->weight.grad().dtype(), DType::F32);  // gradients follow
}

TEST(Module, TiedWeightsAreListedOnceAndStayTied) {
  Module root("Root");
  auto a = root.register_module("a", std::make_shared<Linear>(3, 3, false));
  auto b = root.register_module("b", std::make_shared<Linear>(3, 3, false));
  b->weight = a->weight;  // tie through the slot
  EXPECT_EQ(keys_of(root.named_parameters()), (std::vector<std::string>{"a.weight"}));
  EXPECT_EQ(root.state_dict().keys(), (std::vector<std::string>{"a.weight", "b.weight"}));
  root.to(DType::F64);
  EXPECT_EQ(a->weight.dtype(), DType::F64);
  EXPECT_TRUE(a->weight.same(b->weight));
  EXPECT_TRUE(a->weight.requires_grad());
}

TEST(Module, TrainEvalIsRecursive) {
  Net net;
  EXPECT_TRUE(net.is_training());
  net.eval();
  for (auto& [name, m] : net.named_modules()) EXPECT_FALSE(m->is_training()) << name;
  net.blocks[0]->train();
  EXPECT_TRUE(net.blocks[0]->wq->is_training());
  EXPECT_FALSE(net.is_training());
}

TEST(Module, ZeroGrad) {
  Net net;
  const Tensor ids = from_vector<int64_t>({1, 2}, {2}, TensorOptions{}.with_dtype(DType::I64));
  sum(net(ids)).backward();
  for (auto& [name, p] : net.named_parameters()) ASSERT_TRUE(p.grad().defined()) << name;
  const Tensor g = net.output->bias.grad();
  net.zero_grad(/*set_to_none=*/false);
  EXPECT_TRUE(net.output->bias.grad().same(g));
  for (auto& [name, p] : net.named_parameters())
    EXPECT_TRUE(all_close(p.grad(), zeros_like(p), 0, 0)) << name;
  net.zero_grad();
  for (auto& [name, p] : net.named_parameters()) EXPECT_FALSE(p.grad().defined()) << name;
}

TEST(Module, HooksFireOnceInOrder) {
  Block block(4, f64());
  std::vector<std::string> log;
  bool weight_grad_at_pre = true, weight_grad_at_post = false, x_grad_at_post = true;
  block.register_forward_pre_hook([&](Module& m, std::vector<Tensor>& in) {
    EXPECT_EQ(&m, &block);
    EXPECT_EQ(in.size(), 1u);
    log.push_back("forward_pre");
  });
  block.register_forward_hook(
      [&](Module&, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
        EXPECT_EQ(out.size(), 1u);
        EXPECT_EQ(out[0].shape(), (Shape{3, 4}));
        log.push_back("forward");
      });
  block.register_backward_pre_hook([&](Module&) {
    weight_grad_at_pre = block.wq->weight.grad().defined();
    log.push_back("backward_pre");
  });
  Tensor x = randn64({3, 4}, 5);
  block.register_backward_hook([&](Module&) {
    weight_grad_at_post = block.wq->weight.grad().defined() && block.norm->weight.grad().defined();
    x_grad_at_post = x.grad().defined();
    log.push_back("backward");
  });
  Tensor y = block(x);
  EXPECT_EQ(log, (std::vector<std::string>{"forward_pre", "forward"}));
  // Two uses of the output: the pre-backward hook still fires once.
  Tensor loss = add(sum(mul(y, y)), sum(y));
  loss.backward();
  EXPECT_EQ(log, (std::vector<std::string>{"forward_pre", "forward", "backward_pre", "backward"}));
  EXPECT_FALSE(weight_grad_at_pre);
  EXPECT_TRUE(weight_grad_at_post);  // parameters' gradients are in before the post hook
  EXPECT_FALSE(x_grad_at_post);      // the input's own leaf is reached after the module
  EXPECT_TRUE(x.grad().defined());

  // The hook node is an identity: gradients equal those of a hook-free run.
  Block plain(4, f64());
  plain.load_state_dict(block.state_dict());
  Tensor x2 = x.detach().clone().set_requires_grad(true);
  Tensor y2 = plain(x2);
  add(sum(mul(y2, y2)), sum(y2)).backward();
  EXPECT_TRUE(all_close(x.grad(), x2.grad(), 1e-14, 0));
  EXPECT_TRUE(all_close(block.wq->weight.grad(), plain.wq->weight.grad(), 1e-14, 0));
}

TEST(Module, BackwardHookWithoutGradInputsFiresAtEnd) {
  Embedding emb(5, 3);
  std::vector<std::string> log;
  emb.register_backward_pre_hook([&](Module&) { log.push_back("backward_pre"); });
  emb.register_backward_hook([&](Module&) {
    EXPECT_TRUE(emb.weight.grad().defined());
    log.push_back("backward");
  });
  const Tensor ids = from_vector<int64_t>({1, 1, 4}, {3}, TensorOptions{}.with_dtype(DType::I64));
  Tensor y = emb(ids);
  sum(y).backward();
  EXPECT_EQ(log, (std::vector<std::string>{"backward_pre", "backward"}));
  // Under no_grad the backward hooks are not armed.
  {
    NoGradGuard no_grad;
    emb(ids);
  }
  EXPECT_EQ(log.size(), 2u);
}

TEST(Module, ForwardHooksCanReplaceInputsAndOutputsAndBeRemoved) {
  Linear lin(2, 2, false, f64());
  lin.init_weights(1);
  const Tensor x = randn64({1, 2}, 2, false);
  const Tensor ref = lin(x);
  auto pre = lin.register_forward_pre_hook(
      [](Module&, std::vector<Tensor>& in) { in[0] = mul(in[0], 2.0); });
  EXPECT_TRUE(all_close(lin(x), mul(ref, 2.0), 1e-14, 0));
  auto post =
      lin.register_forward_hook([](Module&, const std::vector<Tensor>&, std::vector<Tensor>& out) {
        out[0] = add(out[0], 1.0);
      });
  EXPECT_TRUE(all_close(lin(x), add(mul(ref, 2.0), 1.0), 1e-14, 0));
  EXPECT_TRUE(lin.remove_hook(pre));
  EXPECT_FALSE(lin.remove_hook(pre));
  EXPECT_TRUE(all_close(lin(x), add(ref, 1.0), 1e-14, 0));
  EXPECT_TRUE(lin.remove_hook(post));
  EXPECT_TRUE(all_close(lin(x), ref, 0, 0));
}

TEST(Layers, LinearMatchesNaiveReference) {
  Linear lin(3, 2, true, f64());
  lin.init_weights(11);
  const Tensor x = randn64({4, 3}, 3, false);
  const auto y = lin(x).to_vector<double>();
  const auto w = lin.weight.to_vector<double>(), b = lin.bias.to_vector<double>();
  const auto xv = x.to_vector<double>();
  for (int i = 0; i < 4; ++i)
    for (int o = 0; o < 2; ++o) {
      double acc = b[o];
      for (int k = 0; k < 3; ++k) acc += xv[i * 3 + k] * w[o * 3 + k];
      EXPECT_NEAR(y[i * 2 + o], acc, 1e-14);
    }
  for (double v : w) EXPECT_LE(std::abs(v), 1.0 / std::sqrt(3.0));
  Linear nobias(3, 2, false);
  EXPECT_FALSE(nobias.has_bias());
  EXPECT_EQ(nobias.named_parameters().size(), 1u);
  EXPECT_THROW(lin(randn64({4, 2}, 3, false)), Error);
}

TEST(Layers, EmbeddingAndRmsNormMatchNaiveReference) {
  Embedding emb(6, 3, f64());
  emb.init_weights(2);
  const Tensor ids = from_vector<int64_t>({5, 0, 5}, {3}, TensorOptions{}.with_dtype(DType::I64));
  const auto y = emb(ids).to_vector<double>();
  const auto w = emb.weight.to_vector<double>();
  const int64_t id[3] = {5, 0, 5};
  for (int i = 0; i < 3; ++i)
    for (int d = 0; d < 3; ++d) EXPECT_EQ(y[i * 3 + d], w[id[i] * 3 + d]);

  RMSNorm norm(3, 1e-5, f64());
  {
    NoGradGuard no_grad;
    norm.weight.copy_(from_vector<double>({1.0, 2.0, 0.5}, {3}, f64()));
  }
  const Tensor x = randn64({2, 3}, 9, false);
  const auto xv = x.to_vector<double>(), out = norm(x).to_vector<double>();
  const double wv[3] = {1.0, 2.0, 0.5};
  for (int r = 0; r < 2; ++r) {
    double ms = 0;
    for (int d = 0; d < 3; ++d) ms += xv[r * 3 + d] * xv[r * 3 + d] / 3.0;
    for (int d = 0; d < 3; ++d)
      EXPECT_NEAR(out[r * 3 + d], xv[r * 3 + d] / std::sqrt(ms + 1e-5) * wv[d], 1e-12);
  }
}

}  // namespace
}  // namespace mt::runtime::nn
