// cross_entropy: values against a naive reference (every reduction, ignore_index, 16-bit logits,
// leading batch dims), the all-ignored mean, gradients against finite differences, errors.
#include "runtime/ops/loss.h"

#include <gtest/gtest.h>

#include <cmath>

#include "runtime/autograd/gradcheck.h"
#include "runtime/ops/factory.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::randn64;
using testing::randn_as;

TensorOptions i64() { return TensorOptions{}.with_dtype(DType::I64); }

// Per-target losses (0 where ignored) in f64, and the number of non-ignored targets.
std::vector<double> naive_losses(const Tensor& logits, const std::vector<int64_t>& t,
                                 int64_t ignore_index, int64_t* count) {
  const std::vector<double> x = logits.to_vector<double>();
  const int64_t V = logits.size(-1), N = int64_t(t.size());
  std::vector<double> out(size_t(N), 0.0);
  *count = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (t[i] == ignore_index) continue;
    ++*count;
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, x[i * V + j]);
    for (int64_t j = 0; j < V; ++j) s += std::exp(x[i * V + j] - mx);
    out[i] = mx + std::log(s) - x[i * V + t[i]];
  }
  return out;
}

TEST(CrossEntropy, MatchesNaiveForEveryReduction) {
  Tensor logits = randn_as({2, 3, 11}, DType::F32, 1);
  const std::vector<int64_t> t = {3, -100, 0, 10, 7, -100};
  Tensor targets = from_vector<int64_t>(t, {2, 3}, i64());
  int64_t count = 0;
  const std::vector<double> ref = naive_losses(logits, t, -100, &count);
  double total = 0;
  for (double v : ref) total += v;
  Tensor none = cross_entropy(logits, targets, -100, Reduction::None);
  EXPECT_EQ(none.shape(), (Shape{2, 3}));
  EXPECT_EQ(none.dtype(), DType::F32);
  EXPECT_TRUE(all_close(none, from_vector<double>(ref, {2, 3}), 1e-5, 1e-5));
  EXPECT_NEAR(cross_entropy(logits, targets, -100, Reduction::Sum).item<double>(), total, 1e-4);
  Tensor mean = cross_entropy(logits, targets);
  EXPECT_EQ(mean.dim(), 0);
  EXPECT_NEAR(mean.item<double>(), total / double(count), 1e-5);
}

TEST(CrossEntropy, CustomIgnoreIndexAndI32Targets) {
  Tensor logits = randn64({4, 5}, 2, false);
  const std::vector<int64_t> t = {1, 2, 2, 4};
  Tensor targets = from_vector<int64_t>(t, {4}, TensorOptions{}.with_dtype(DType::I32));
  int64_t count = 0;
  const std::vector<double> ref = naive_losses(logits, t, 2, &count);
  EXPECT_EQ(count, 2);
  EXPECT_NEAR(cross_entropy(logits, targets, 2).item<double>(), (ref[0] + ref[3]) / 2, 1e-12);
}

TEST(CrossEntropy, SixteenBitLogitsComputeInF32) {
  Tensor logits = randn_as({8, 1000}, DType::BF16, 3);
  std::vector<int64_t> t(8);
  for (int64_t i = 0; i < 8; ++i) t[i] = (i * 137) % 1000;
  int64_t count = 0;
  const std::vector<double> ref = naive_losses(logits, t, -100, &count);
  Tensor none = cross_entropy(logits, from_vector<int64_t>(t, {8}, i64()), -100, Reduction::None);
  EXPECT_EQ(none.dtype(), DType::BF16);
  EXPECT_TRUE(all_close(none, from_vector<double>(ref, {8}), 1e-3, 8e-3));
}

TEST(CrossEntropy, AllIgnoredMeanIsZeroWithZeroGradient) {
  Tensor logits = randn64({3, 4}, 4);
  Tensor targets = full({3}, -100, i64());
  Tensor loss = cross_entropy(logits, targets);
  EXPECT_EQ(loss.item<double>(), 0.0);
  loss.backward();
  EXPECT_EQ(logits.grad().to_vector<double>(), std::vector<double>(12, 0.0));
}

TEST(CrossEntropy, GradientIsSoftmaxMinusOneHot) {
  Tensor logits = randn64({2, 3}, 5);
  Tensor targets = from_vector<int64_t>({2, 0}, {2}, i64());
  cross_entropy(logits, targets, -100, Reduction::Sum).backward();
  const std::vector<double> x = logits.to_vector<double>(), g = logits.grad().to_vector<double>();
  for (int i = 0; i < 2; ++i) {
    double s = 0;
    for (int j = 0; j < 3; ++j) s += std::exp(x[i * 3 + j]);
    for (int j = 0; j < 3; ++j) {
      const double onehot = j == (i == 0 ? 2 : 0) ? 1.0 : 0.0;
      EXPECT_NEAR(g[i * 3 + j], std::exp(x[i * 3 + j]) / s - onehot, 1e-12);
    }
  }
}

TEST(CrossEntropy, GradcheckEveryReductionWithIgnoredTargets) {
  Tensor targets = from_vector<int64_t>({1, -100, 4, 0, 2, -100}, {2, 3}, i64());
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    Tensor logits = randn64({2, 3, 5}, 6);
    auto r = autograd::gradcheck(
        [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], targets, -100, red); },
        {logits});
    EXPECT_TRUE(r.ok) << "reduction " << int(red) << "\n" << r.message;
  }
}

TEST(CrossEntropy, GradcheckStridedLogits) {
  Tensor logits = randn64({5, 4}, 7, false).t().set_requires_grad(true);  // [4, 5], transposed
  ASSERT_FALSE(logits.is_contiguous());
  Tensor targets = from_vector<int64_t>({4, 0, 3, 1}, {4}, i64());
  auto r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], targets); }, {logits});
  EXPECT_TRUE(r.ok) << r.message;
}

// The f32 and bf16 kernels (vectorised f32 rows) against the f64 kernel on the same values.
TEST(CrossEntropy, LowPrecisionMatchesF64) {
  Tensor targets = from_vector<int64_t>({5, -100, 299, 0, 17, 123}, {6}, i64());
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor x = randn_as({6, 300}, dt, 8).set_requires_grad(true);
    Tensor x64 = x.detach().to(DType::F64).set_requires_grad(true);
    Tensor loss = cross_entropy(x, targets), loss64 = cross_entropy(x64, targets);
    EXPECT_NEAR(loss.item<double>(), loss64.item<double>(), dt == DType::F32 ? 1e-5 : 3e-2);
    loss.backward();
    loss64.backward();
    const double tol = dt == DType::F32 ? 1e-6 : 1e-3;
    EXPECT_TRUE(all_close(x.grad(), x64.grad(), tol, 1e-2)) << dtype_name(dt);
  }
}

TEST(CrossEntropy, Errors) {
  Tensor logits = zeros({2, 3, 5});
  Tensor bad = from_vector<int64_t>({0, 1, 2, 3, 7, 4}, {2, 3}, i64());
  try {
    cross_entropy(logits, bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cross_entropy"), std::string::npos) << msg;
    EXPECT_NE(msg.find("target 7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[1, 1]"), std::string::npos) << msg;  // its position
  }
  EXPECT_THROW(cross_entropy(logits, from_vector<int64_t>({0, -1, 0, 0, 0, 0}, {2, 3}, i64())),
               Error);
  EXPECT_THROW(cross_entropy(logits, zeros({2, 3}, i64()).reshape({6})), Error);  // shape
  EXPECT_THROW(cross_entropy(logits, zeros({2, 3})), Error);                      // f32 targets
  EXPECT_THROW(cross_entropy(zeros({2, 3}, i64()), zeros({2}, i64())), Error);    // int logits
}

}  // namespace
}  // namespace mt::runtime
