// EmbeddingBagCollection / EmbeddingCollection: TorchRec parameter names, init bounds and shards,
// outputs against plain ops; fused row optimizers (exact SGD, exact row-wise Adagrad, Adam,
// partial row-wise Adam) against references written with plain ops over several steps with
// duplicate ids (rows no id touched keep their values and state); the row-sparse mode (same
// updates at apply time, gradient accumulation, norm for clipping) and the dense mode.
#include "runtime/sparse/embedding_collection.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/embedding.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"
#include "runtime/ops/reduce.h"
#include "runtime/sparse/embedding_bag_collection.h"
#include "runtime/sparse/row_sparse_grad.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime::sparse {
namespace {

using testing::all_close;
using testing::error_of;
using testing::randn_as;

const TensorOptions kI64 = TensorOptions{}.with_dtype(DType::I64);
const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::F64);

std::vector<EmbeddingBagConfig> configs(EmbeddingOptimizerConfig opt) {
  EmbeddingBagConfig a;
  a.name = "t_a";
  a.num_embeddings = 6;
  a.embedding_dim = 3;
  a.feature_names = {"a"};
  a.optimizer = opt;
  EmbeddingBagConfig b;
  b.name = "t_b";
  b.num_embeddings = 5;
  b.embedding_dim = 4;
  b.feature_names = {"b", "c"};
  b.pooling = PoolingMode::Mean;
  b.optimizer = opt;
  return {a, b};
}

// Step s's batch: keys in another order than the collection's and an extra key; B = 3, with
// duplicate ids, an empty bag, and rows 5 of t_a / 4 of t_b never touched.
KeyedJaggedTensor batch(int s) {
  const std::vector<std::vector<int64_t>> c = {{0, 0}, {3}, {}};
  const std::vector<std::vector<int64_t>> a = {{1, 1, 2}, {}, {0, 4, 1}};
  const std::vector<std::vector<int64_t>> b = {{2}, {1, 1}, {3, 0, 1}};
  std::vector<int64_t> values, lengths;
  auto add = [&](const std::vector<std::vector<int64_t>>& key) {
    for (int i = 0; i < 3; ++i) {
      const auto& bag = key[(i + s) % 3];
      values.insert(values.end(), bag.begin(), bag.end());
      lengths.push_back(int64_t(bag.size()));
    }
  };
  add(c);
  add(a);
  add(b);
  add({{9}, {9}, {9}});  // "x": not used by the collection
  return KeyedJaggedTensor::from_lengths({"c", "a", "b", "x"}, values, lengths);
}

// Plain ops: pooled rows of one key of `kjt` from table w (SUM or MEAN, empty bag -> 0).
Tensor pooled_ref(const Tensor& w, const KeyedJaggedTensor& kjt, const std::string& key,
                  bool mean) {
  const JaggedTensor jt = kjt[key];
  const std::vector<int64_t> ids = jt.values.to_vector<int64_t>();
  const std::vector<int64_t> off = jt.offsets.to_vector<int64_t>();
  std::vector<Tensor> rows;
  for (int64_t b = 0; b < kjt.stride(); ++b) {
    const int64_t n = off[b + 1] - off[b];
    if (n == 0) {
      rows.push_back(zeros({1, w.size(1)}, w.options()));
      continue;
    }
    std::vector<int64_t> bag(ids.begin() + off[b], ids.begin() + off[b + 1]);
    Tensor p = sum(embedding(w, from_vector(bag, {n}, kI64)), {0}, true);
    rows.push_back(mean ? div(p, double(n)) : p);
  }
  return cat(rows, 0);
}

Tensor touched_mask(const KeyedJaggedTensor& kjt, const std::vector<std::string>& keys,
                    int64_t rows) {
  std::vector<double> m(size_t(rows), 0.0);
  for (const std::string& k : keys)
    for (int64_t id : kjt[k].values.to_vector<int64_t>()) m[id] = 1.0;
  return from_vector(m, {rows, 1}, kF64);
}

// Reference training state for one table, updated with plain ops.
struct RefTable {
  Tensor w, m1, m2;
  int64_t step = 0;
};

void ref_update(RefTable& t, const Tensor& g, const Tensor& mask,
                const EmbeddingOptimizerConfig& c) {
  NoGradGuard ng;
  ++t.step;
  const double bc1 = 1 - std::pow(c.beta1, double(t.step));
  const double bc2 = 1 - std::pow(c.beta2, double(t.step));
  switch (c.type) {
    case EmbOptimType::SGD:
      t.w = sub(t.w, mul(add(g, mul(mul(t.w, mask), c.weight_decay)), c.lr));
      break;
    case EmbOptimType::RowwiseAdagrad: {
      const Tensor gp = add(g, mul(mul(t.w, mask), c.weight_decay));
      t.m1 = add(t.m1, mean(square(gp), {1}, true));
      t.w = sub(t.w, div(mul(gp, c.lr), add(sqrt(t.m1), c.eps)));
      break;
    }
    case EmbOptimType::Adam:
    case EmbOptimType::PartialRowwiseAdam: {
      const Tensor m1n = add(mul(t.m1, c.beta1), mul(g, 1 - c.beta1));
      const Tensor g2 = c.type == EmbOptimType::Adam ? square(g) : mean(square(g), {1}, true);
      const Tensor m2n = add(mul(t.m2, c.beta2), mul(g2, 1 - c.beta2));
      t.m1 = add(t.m1, mul(mask, sub(m1n, t.m1)));
      t.m2 = add(t.m2, mul(mask, sub(m2n, t.m2)));
      const Tensor upd =
          add(div(div(t.m1, bc1), add(sqrt(div(t.m2, bc2)), c.eps)), mul(t.w, c.weight_decay));
      t.w = sub(t.w, mul(mul(upd, mask), c.lr));
      break;
    }
  }
}

// Runs `steps` training steps of the collection (fused or row-sparse mode) and of the plain-ops
// reference, comparing weights and optimizer state after every step.
void check_against_reference(EmbeddingOptimizerConfig opt, GradientMode mode, int steps = 4) {
  CollectionOptions o;
  o.gradient_mode = mode;
  o.dtype = DType::F64;
  EmbeddingBagCollection ebc(configs(opt), o);
  ebc.init_weights(7);
  const Tensor initial_a = ebc.weights()[0].clone();
  std::vector<RefTable> ref(2);
  for (int t = 0; t < 2; ++t) {
    ref[t].w = ebc.weights()[t].clone();
    const int64_t rows = ref[t].w.size(0), dim = ref[t].w.size(1);
    const bool full_m2 = opt.type == EmbOptimType::Adam;
    ref[t].m1 = zeros({rows, opt.type == EmbOptimType::RowwiseAdagrad ? 1 : dim}, kF64);
    ref[t].m2 = zeros({rows, full_m2 ? dim : 1}, kF64);
  }
  for (int s = 0; s < steps; ++s) {
    const KeyedJaggedTensor kjt = batch(s);
    const Tensor upstream = randn_as({3, 3 + 4 + 4}, DType::F64, 100 + s);
    const KeyedTensor out = ebc(kjt);
    ASSERT_EQ(out.keys, (std::vector<std::string>{"a", "b", "c"}));
    sum(mul(out.values, upstream)).backward();
    if (mode == GradientMode::RowSparse) ebc.apply_sparse_grads();

    Tensor wa = ref[0].w.clone().set_requires_grad(true);
    Tensor wb = ref[1].w.clone().set_requires_grad(true);
    const Tensor ref_out = cat({pooled_ref(wa, kjt, "a", false), pooled_ref(wb, kjt, "b", true),
                                pooled_ref(wb, kjt, "c", true)},
                               1);
    EXPECT_TRUE(all_close(out.values, ref_out, 1e-12, 1e-12)) << "step " << s;
    sum(mul(ref_out, upstream)).backward();
    ref_update(ref[0], wa.grad(), touched_mask(kjt, {"a"}, 6), opt);
    ref_update(ref[1], wb.grad(), touched_mask(kjt, {"b", "c"}, 5), opt);

    for (int t = 0; t < 2; ++t) {
      EXPECT_TRUE(all_close(ebc.weights()[t], ref[t].w, 1e-12, 1e-10))
          << optimizer_name(opt.type) << " step " << s << " table " << t;
      const auto state = ebc.fused_optimizer().table_state(t);
      for (const auto& [name, tensor] : state) {
        const Tensor& expected = name == "momentum1" ? ref[t].m1 : ref[t].m2;
        EXPECT_TRUE(all_close(tensor, expected, 1e-12, 1e-10))
            << optimizer_name(opt.type) << " " << name << " step " << s << " table " << t;
      }
      EXPECT_EQ(ebc.fused_optimizer().step_count(t), s + 1);
    }
  }
  // Rows no batch touched kept their initial values.
  EXPECT_EQ(ebc.weights()[0].select(0, 5).to_vector<double>(),
            initial_a.select(0, 5).to_vector<double>());
  EXPECT_FALSE(all_close(ebc.weights()[0], initial_a, 1e-3, 0));
}

EmbeddingOptimizerConfig opt_of(EmbOptimType type, double wd) {
  EmbeddingOptimizerConfig c;
  c.type = type;
  c.lr = 0.1;
  c.eps = 1e-6;
  c.weight_decay = wd;
  return c;
}

TEST(FusedEmbeddingOptimizer, ExactRowwiseAdagradMatchesPlainOps) {
  check_against_reference(opt_of(EmbOptimType::RowwiseAdagrad, 0.0), GradientMode::Fused);
  check_against_reference(opt_of(EmbOptimType::RowwiseAdagrad, 0.01), GradientMode::Fused);
}
TEST(FusedEmbeddingOptimizer, ExactSgdMatchesPlainOps) {
  check_against_reference(opt_of(EmbOptimType::SGD, 0.01), GradientMode::Fused);
}
TEST(FusedEmbeddingOptimizer, AdamMatchesPlainOps) {
  check_against_reference(opt_of(EmbOptimType::Adam, 0.01), GradientMode::Fused);
}
TEST(FusedEmbeddingOptimizer, PartialRowwiseAdamMatchesPlainOps) {
  check_against_reference(opt_of(EmbOptimType::PartialRowwiseAdam, 0.01), GradientMode::Fused);
}
TEST(FusedEmbeddingOptimizer, RowSparseModeAppliesTheSameUpdates) {
  for (EmbOptimType t : {EmbOptimType::SGD, EmbOptimType::RowwiseAdagrad, EmbOptimType::Adam,
                         EmbOptimType::PartialRowwiseAdam})
    check_against_reference(opt_of(t, 0.01), GradientMode::RowSparse, 3);
}

TEST(FusedEmbeddingOptimizer, StateDictRoundTripAndErrors) {
  CollectionOptions o;
  o.dtype = DType::F64;
  EmbeddingBagCollection ebc(configs(opt_of(EmbOptimType::PartialRowwiseAdam, 0.0)), o);
  sum(ebc(batch(0)).values).backward();
  const nn::StateDict sd = ebc.optimizer_state_dict();
  EXPECT_EQ(sd.keys(),
            (std::vector<std::string>{
                "embedding_bags.t_a.weight.momentum1", "embedding_bags.t_a.weight.momentum2",
                "embedding_bags.t_a.weight.step", "embedding_bags.t_b.weight.momentum1",
                "embedding_bags.t_b.weight.momentum2", "embedding_bags.t_b.weight.step"}));
  EXPECT_EQ(sd.at("embedding_bags.t_b.weight.momentum2").shape(), (Shape{5, 1}));
  EmbeddingBagCollection other(configs(opt_of(EmbOptimType::PartialRowwiseAdam, 0.0)), o);
  other.load_optimizer_state_dict(sd);
  EXPECT_EQ(other.fused_optimizer().step_count(1), 1);
  EXPECT_TRUE(all_close(other.fused_optimizer().table_state(0)[0].second,
                        ebc.fused_optimizer().table_state(0)[0].second, 0, 0));
  nn::StateDict bad;
  bad.insert("embedding_bags.t_a.weight.momentum1", zeros({2, 2}, kF64));
  const std::string e = error_of([&] { other.load_optimizer_state_dict(bad); });
  EXPECT_NE(e.find("embedding_bags.t_a.weight.momentum1: expected f64 [6, 3], got f64 [2, 2]"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("missing embedding_bags.t_b.weight.step"), std::string::npos) << e;
}

TEST(RowSparseMode, AccumulatesAndGivesTheClipNorm) {
  CollectionOptions o;
  o.gradient_mode = GradientMode::RowSparse;
  o.dtype = DType::F64;
  EmbeddingBagCollection ebc(configs(opt_of(EmbOptimType::SGD, 0.0)), o);
  CollectionOptions od = o;
  od.gradient_mode = GradientMode::Dense;
  EmbeddingBagCollection dense(configs(opt_of(EmbOptimType::SGD, 0.0)), od);
  EXPECT_FALSE(ebc.weights()[0].requires_grad());
  EXPECT_TRUE(dense.weights()[0].requires_grad());
  for (int s = 0; s < 2; ++s) {  // two micro-batches accumulate
    const Tensor up = randn_as({3, 11}, DType::F64, 50 + s);
    sum(mul(ebc(batch(s)).values, up)).backward();
    sum(mul(dense(batch(s)).values, up)).backward();
  }
  ASSERT_EQ(ebc.sparse_grads().size(), 2u);
  double dense_pow = 0;
  for (int t = 0; t < 2; ++t) {
    const Tensor g = dense.weights()[t].grad();
    EXPECT_TRUE(all_close(ebc.sparse_grads()[t].to_dense(), g, 1e-12, 1e-12)) << "table " << t;
    dense_pow += sum(square(g)).item<double>();
  }
  EXPECT_NEAR(row_sparse_norm_pow(ebc.sparse_grads()), dense_pow, 1e-12 * dense_pow);
  scale_(ebc.mutable_sparse_grads(), 0.5);
  EXPECT_NEAR(row_sparse_norm_pow(ebc.sparse_grads()), 0.25 * dense_pow, 1e-12 * dense_pow);
  const Tensor before = ebc.weights()[1].clone();
  ebc.apply_sparse_grads();
  EXPECT_TRUE(ebc.sparse_grads().empty());
  // SGD lr 0.1 with the halved accumulated gradient.
  EXPECT_TRUE(all_close(ebc.weights()[1], sub(before, mul(dense.weights()[1].grad(), 0.5 * 0.1)),
                        1e-12, 1e-12));
}

TEST(EmbeddingBagCollection, NamesInitShardsAndOutputs) {
  EmbeddingBagCollection ebc(configs({}));
  ebc.init_weights(3);
  const nn::StateDict sd = ebc.state_dict();
  EXPECT_EQ(sd.keys(),
            (std::vector<std::string>{"embedding_bags.t_a.weight", "embedding_bags.t_b.weight"}));
  for (int t = 0; t < 2; ++t) {
    const double bound = std::sqrt(1.0 / (t == 0 ? 6 : 5));
    for (double v : ebc.weights()[t].to_vector<double>()) {
      EXPECT_LE(std::abs(v), bound);
    }
  }
  // A row-and-column shard of t_b holds exactly those values of the full table.
  std::vector<EmbeddingBagConfig> sharded = configs({});
  sharded[1].shard = {.row_offset = 2, .num_rows = 2, .col_offset = 1, .num_cols = 2};
  EmbeddingBagCollection part(sharded);
  part.init_weights(3);
  EXPECT_EQ(part.weights()[1].shape(), (Shape{2, 2}));
  EXPECT_EQ(part.weights()[1].to_vector<double>(),
            ebc.weights()[1].narrow(0, 2, 2).narrow(1, 1, 2).contiguous().to_vector<double>());
  EXPECT_EQ(part.feature_dims(), (std::vector<int64_t>{3, 2, 2}));

  const KeyedJaggedTensor kjt = batch(1);
  ebc.eval();
  const KeyedTensor out = ebc(kjt);
  EXPECT_FALSE(out.values.requires_grad());
  EXPECT_EQ(out.values.shape(), (Shape{3, 11}));
  EXPECT_EQ(out.offset_per_key(), (std::vector<int64_t>{0, 3, 7, 11}));
  EXPECT_TRUE(all_close(out["c"], pooled_ref(ebc.weights()[1], kjt, "c", true)));
  EXPECT_TRUE(all_close(out["a"], pooled_ref(ebc.weights()[0], kjt, "a", false)));
}

TEST(EmbeddingBagCollection, WeightedPooling) {
  CollectionOptions o;
  o.is_weighted = true;
  EmbeddingBagCollection ebc(configs({}), o);
  const KeyedJaggedTensor kjt = KeyedJaggedTensor::from_lengths(
      {"a", "b", "c"}, {1, 1, 4, 2}, {2, 0, 1, 1, 0, 0}, {0.5f, 2.0f, 1.0f, 3.0f});
  const KeyedTensor out = ebc(kjt);
  const std::vector<double> w = ebc.weights()[0].to_vector<double>();
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(out["a"].to_vector<double>()[j], 2.5 * w[3 + j], 1e-6);
  // b (MEAN): sample 0 = 1.0 * row 4, sample 1 = 3.0 * row 2 (a one-id bag's mean is its row).
  const std::vector<double> wb = ebc.weights()[1].to_vector<double>();
  const std::vector<double> ob = out["b"].to_vector<double>();
  for (int j = 0; j < 4; ++j) {
    EXPECT_NEAR(ob[j], wb[16 + j], 1e-6);
    EXPECT_NEAR(ob[4 + j], 3.0 * wb[8 + j], 1e-6);
  }
  EXPECT_NE(
      error_of([&] { ebc(batch(0)); }).find("is_weighted is set but the input has no weights"),
      std::string::npos);
}

TEST(EmbeddingBagCollection, Errors) {
  EmbeddingBagCollection ebc(configs({}));
  EXPECT_NE(error_of([&] {
              ebc(KeyedJaggedTensor::from_lengths({"a", "b"}, {0}, {1, 0, 0, 0}));
            }).find("no key 'c'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ebc(KeyedJaggedTensor::from_lengths({"a", "b", "c"}, {0, 5}, {1, 1, 0}));
            }).find("id 5 of key 'b', sample 0 is outside [0, 5) of table 't_b'"),
            std::string::npos);
  std::vector<EmbeddingBagConfig> dup = configs({});
  dup[1].feature_names.push_back("a");
  EXPECT_NE(error_of([&] {
              EmbeddingBagCollection x(dup);
            }).find("feature 'a' is listed by more than one table"),
            std::string::npos);
  std::vector<EmbeddingBagConfig> bad_shard = configs({});
  bad_shard[0].shard.row_offset = 5;
  bad_shard[0].shard.num_rows = 2;
  EXPECT_NE(error_of([&] { EmbeddingBagCollection x(bad_shard); }).find("do not fit the table"),
            std::string::npos);
}

TEST(EmbeddingCollection, UnpooledRowsAndFusedUpdate) {
  CollectionOptions o;
  o.dtype = DType::F64;
  EmbeddingCollection ec(configs(opt_of(EmbOptimType::SGD, 0.0)), o);
  EXPECT_EQ(ec.state_dict().keys(),
            (std::vector<std::string>{"embeddings.t_a.weight", "embeddings.t_b.weight"}));
  const KeyedJaggedTensor kjt = batch(0);
  const Tensor wb = ec.weights()[1].clone();
  const EmbeddingCollectionOutput out = ec(kjt);
  const JaggedTensor& c = out["c"];
  EXPECT_EQ(c.lengths.to_vector<int64_t>(), kjt["c"].lengths.to_vector<int64_t>());
  EXPECT_TRUE(all_close(c.values, embedding(wb, kjt["c"].values), 0, 0));
  // d loss / d row = 1 for every id: SGD subtracts lr * (count of the id) from each of its rows.
  sum(out.flat).backward();
  std::vector<double> count(5, 0);
  for (const char* k : {"b", "c"})
    for (int64_t id : kjt[k].values.to_vector<int64_t>()) count[id] += 1;
  const Tensor expected = sub(wb, mul(from_vector(count, {5, 1}, kF64), 0.1));
  EXPECT_TRUE(all_close(ec.weights()[1], expected, 1e-12, 1e-12));
}

}  // namespace
}  // namespace mt::runtime::sparse
