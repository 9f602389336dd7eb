// float8_grouped_mm (runtime/ops/float8_grouped.h) on the CPU reference: the forward and both
// gradients are the per-expert products of operands cast rowwise along each GEMM's contracted
// dimension (the weight gradient's scaled over each expert's own tokens), an expert's results do
// not depend on the other experts' tokens, groups of any size are padded as on a GPU, the result
// tracks the f32 grouped_mm, weights reading one input share its casts, token shards whose
// amaxes are reduced (tensor parallelism) compute one call's results, and bad operands are
// errors naming what is wrong.
#include "runtime/ops/float8_grouped.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "runtime/core/profiler.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/float8.h"
#include "runtime/ops/grouped_matmul.h"
#include "runtime/ops/join.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using ::testing::HasSubstr;
using testing::all_close;
using testing::error_of;
using testing::randn_as;

// t [rows, cols] cast per row (e4m3, power-of-two scales) and dequantized: the values an FP8 GEMM
// multiplies.
Tensor dq(const Tensor& t) {
  const Float8Tensor q = to_float8_rowwise(t.contiguous(), Float8Format::E4M3, true);
  return float8_dequantize(q.codes, Float8Format::E4M3, q.scale_inv);
}

// a [n, c] @ b [p, c]^T in f32.
Tensor product_t(const Tensor& a, const Tensor& b) { return matmul(a, b.transpose(0, 1)); }

struct GroupedRun {
  Tensor y, dx, dw;
};

// y = float8_grouped_mm(x, w, counts, reduce), backpropagated from sum(y * r).
GroupedRun run(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts,
               const Tensor& r, const Float8AmaxReduce& reduce = nullptr) {
  const Tensor xl = x.detach().set_requires_grad(true);
  const Tensor wl = w.detach().set_requires_grad(true);
  const Tensor y = float8_grouped_mm(xl, wl, counts, reduce);
  sum(mul(y, r)).backward();
  return {y.detach(), xl.grad(), wl.grad()};
}

const std::vector<int64_t> kCounts{16, 0, 32};  // 3 experts, one without tokens

TEST(Float8GroupedMm, ForwardAndGradientsArePerExpertRowwiseScaledProducts) {
  const Tensor x = randn_as({48, 32}, DType::F32, 1, "x");
  const Tensor w = randn_as({3, 48, 32}, DType::F32, 2, "w");
  const Tensor r = randn_as({48, 48}, DType::F32, 3, "r");
  const GroupedRun got = run(x, w, kCounts, r);
  ASSERT_EQ(got.y.shape(), (Shape{48, 48}));
  ASSERT_EQ(got.dx.shape(), (Shape{48, 32}));
  ASSERT_EQ(got.dw.shape(), (Shape{3, 48, 32}));
  int64_t offset = 0;
  for (int64_t e = 0; e < 3; ++e) {
    SCOPED_TRACE(e);
    const int64_t n = kCounts[size_t(e)];
    const Tensor we = w.select(0, e);
    if (n == 0) {  // an expert without tokens: a zero weight gradient
      EXPECT_EQ(sum(abs(got.dw.select(0, e))).item<double>(), 0.0);
      continue;
    }
    const Tensor xe = x.narrow(0, offset, n), ge = r.narrow(0, offset, n);
    // y_e = x_e (by token) @ W_e (by output feature)^T
    EXPECT_TRUE(all_close(got.y.narrow(0, offset, n), product_t(dq(xe), dq(we)), 1e-5, 1e-5));
    // dx_e = dy_e (by token) @ W_e, W_e scaled by input feature over the outputs
    EXPECT_TRUE(all_close(got.dx.narrow(0, offset, n),
                          product_t(dq(ge), dq(we.transpose(0, 1))), 1e-5, 1e-5));
    // dW_e = dy_e^T @ x_e, both scaled per feature over this expert's tokens alone
    EXPECT_TRUE(all_close(got.dw.select(0, e),
                          product_t(dq(ge.transpose(0, 1)), dq(xe.transpose(0, 1))), 1e-4, 1e-5));
    offset += n;
  }
}

// Another expert's tokens set none of an expert's scales: scaling expert 2's tokens by 1000
// leaves expert 0's outputs, input gradients and weight gradient bitwise unchanged (so with
// expert parallelism an expert computes what it would in one process).
TEST(Float8GroupedMm, AnExpertsResultsDoNotDependOnOtherExpertsTokens) {
  const Tensor x = randn_as({48, 32}, DType::F32, 4, "x");
  const Tensor w = randn_as({3, 48, 32}, DType::F32, 5, "w");
  const Tensor r = randn_as({48, 48}, DType::F32, 6, "r");
  const Tensor loud = cat({x.narrow(0, 0, 16), mul(x.narrow(0, 16, 32), 1000.0)}, 0);
  const Tensor loud_r = cat({r.narrow(0, 0, 16), mul(r.narrow(0, 16, 32), 1000.0)}, 0);
  const GroupedRun a = run(x, w, kCounts, r), b = run(loud, w, kCounts, loud_r);
  EXPECT_TRUE(all_close(a.y.narrow(0, 0, 16), b.y.narrow(0, 0, 16), 0, 0));
  EXPECT_TRUE(all_close(a.dx.narrow(0, 0, 16), b.dx.narrow(0, 0, 16), 0, 0));
  EXPECT_TRUE(all_close(a.dw.select(0, 0), b.dw.select(0, 0), 0, 0));
  EXPECT_FALSE(all_close(a.dw.select(0, 2), b.dw.select(0, 2), 1e-3, 0));
}

// Groups whose token count is not a multiple of 16 (as FP8 GEMMs need) are padded with zero
// rows: bitwise the results of the call on the padded rows, and gradients for x's own rows.
TEST(Float8GroupedMm, GroupsOfAnySizeArePaddedWithZeroRows) {
  const std::vector<int64_t> counts{3, 0, 20, 9};
  const std::vector<int64_t> padded_counts{16, 0, 32, 16};
  const Tensor x = randn_as({32, 16}, DType::F32, 7, "x");
  const Tensor w = randn_as({4, 32, 16}, DType::F32, 8, "w");
  const Tensor r = randn_as({32, 32}, DType::F32, 9, "r");
  const auto pad = [&](const Tensor& t) {
    const int64_t cols = t.size(1);
    return cat({t.narrow(0, 0, 3), zeros({13, cols}), t.narrow(0, 3, 20), zeros({12, cols}),
                t.narrow(0, 23, 9), zeros({7, cols})},
               0);
  };
  const GroupedRun got = run(x, w, counts, r);
  const GroupedRun want = run(pad(x), w, padded_counts, pad(r));
  ASSERT_EQ(got.y.shape(), (Shape{32, 32}));
  EXPECT_TRUE(all_close(pad(got.y), want.y, 0, 0));
  EXPECT_TRUE(all_close(pad(got.dx), want.dx, 0, 0));
  EXPECT_TRUE(all_close(got.dw, want.dw, 0, 0));
  // No tokens at all: an empty result and zero weight gradients.
  const GroupedRun none = run(zeros({0, 16}), w, {0, 0, 0, 0}, zeros({0, 32}));
  EXPECT_EQ(none.y.shape(), (Shape{0, 32}));
  EXPECT_EQ(sum(abs(none.dw)).item<double>(), 0.0);
}

// Two ranks that each hold a share of the experts' tokens (tensor parallelism), as two calls in
// one process: a token-amax reduce that records what each call is given, then one that takes the
// maximum with the other call's (an all-reduce of two ranks).
Float8AmaxReduce recording(std::vector<Tensor>& seen) {
  return [&seen](Tensor& amax) { seen.push_back(amax.clone()); };
}
Float8AmaxReduce max_with(const std::vector<Tensor>& other) {
  return [&other, call = std::make_shared<size_t>(0)](Tensor& amax) {
    ASSERT_LT(*call, other.size());
    ASSERT_EQ(amax.shape(), other[*call].shape());
    amax.copy_(maximum(amax, other[(*call)++]));
  };
}

// Token shards whose amaxes are reduced compute one call's results: the same rows of y and dx,
// and weight gradients that add up to the call's. Shard A's tokens are quiet (x * 1e-6) and its
// output gradient loud in half the features (* 1e6), so their scales differ from the whole
// call's: without the reduce, the weight gradients' sum is far from one call's. Shard A has no
// tokens for expert 1 (its amaxes are zero rows, still reduced).
TEST(Float8GroupedMm, TokenShardsWithReducedAmaxesComputeOneCallsGradients) {
  const Tensor x = randn_as({48, 32}, DType::F32, 12, "x");
  const Tensor w = randn_as({2, 32, 32}, DType::F32, 13, "w");
  const Tensor r = randn_as({48, 32}, DType::F32, 14, "r");
  const Tensor loud_half = cat({mul(r.narrow(0, 0, 16).narrow(1, 0, 16), 1e6),
                                r.narrow(0, 0, 16).narrow(1, 16, 16)},
                               1);
  const Tensor xw = cat({mul(x.narrow(0, 0, 16), 1e-6), x.narrow(0, 16, 32)}, 0);
  const Tensor rw = cat({loud_half, r.narrow(0, 16, 32)}, 0);
  const std::vector<int64_t> counts{32, 16}, counts_a{16, 0}, counts_b{16, 16};
  const Tensor xa = xw.narrow(0, 0, 16), ra = rw.narrow(0, 0, 16);
  const Tensor xb = xw.narrow(0, 16, 32), rb = rw.narrow(0, 16, 32);
  std::vector<Tensor> seen_a, seen_b;
  run(xa, w, counts_a, ra, recording(seen_a));
  run(xb, w, counts_b, rb, recording(seen_b));
  ASSERT_EQ(seen_a.size(), 2u);  // x's in forward, the output gradient's in backward
  EXPECT_EQ(seen_a[0].shape(), (Shape{2, 32}));
  EXPECT_EQ(sum(abs(seen_a[0].select(0, 1))).item<double>(), 0.0);  // no tokens for expert 1

  const GroupedRun whole = run(xw, w, counts, rw);
  const GroupedRun a = run(xa, w, counts_a, ra, max_with(seen_b));
  const GroupedRun b = run(xb, w, counts_b, rb, max_with(seen_a));
  // Scaled per token: each shard's rows of y and dx are the call's, bitwise.
  EXPECT_TRUE(all_close(a.y, whole.y.narrow(0, 0, 16), 0, 0));
  EXPECT_TRUE(all_close(b.y, whole.y.narrow(0, 16, 32), 0, 0));
  EXPECT_TRUE(all_close(a.dx, whole.dx.narrow(0, 0, 16), 0, 0));
  EXPECT_TRUE(all_close(b.dx, whole.dx.narrow(0, 16, 32), 0, 0));
  // The weight gradients add up to the call's (to f32 rounding: two sums over tokens, not one).
  EXPECT_TRUE(all_close(add(a.dw, b.dw), whole.dw, 1e-5, 1e-5));
  EXPECT_GT(sum(abs(whole.dw.select(0, 0).narrow(0, 16, 16))).item<double>(), 1.0);
  // Each shard scaled over its own tokens: far from one call.
  const GroupedRun a_alone = run(xa, w, counts_a, ra), b_alone = run(xb, w, counts_b, rb);
  EXPECT_FALSE(all_close(add(a_alone.dw, b_alone.dw), whole.dw, 1e-2, 1e-2));
}

// Weights reading one x (a SwiGLU's w1 and w3) in one call: bit for bit the outputs and
// gradients of one call per weight, with x cast once (by token, and per (expert, feature) for the
// weight gradients: one token-amax reduce in the forward instead of one per weight), on groups
// that need padding and groups that do not.
TEST(Float8GroupedMm, WeightsReadingOneInputCastItOnceWithTheSameResults) {
  for (const std::vector<int64_t>& counts :
       {std::vector<int64_t>{16, 0, 32}, std::vector<int64_t>{5, 0, 27}}) {
    SCOPED_TRACE(counts[0]);
    const int64_t n = counts[0] + counts[2];
    const Tensor x0 = randn_as({n, 32}, DType::F32, 15, "x");
    const Tensor w1 = randn_as({3, 48, 32}, DType::F32, 16, "w1");
    const Tensor w3 = randn_as({3, 16, 32}, DType::F32, 17, "w3");
    const Tensor r1 = randn_as({n, 48}, DType::F32, 18, "r1");
    const Tensor r3 = randn_as({n, 16}, DType::F32, 19, "r3");
    struct Run {
      std::vector<Tensor> values;  // y1, y3, dx, dw1, dw3
      int64_t casts = 0, reduces = 0, forward_reduces = 0;
    };
    const auto run = [&](bool together) {
      const Tensor x = x0.clone().set_requires_grad(true);
      const Tensor a = w1.clone().set_requires_grad(true), b = w3.clone().set_requires_grad(true);
      Run out;
      const Float8AmaxReduce count = [&out](Tensor&) { ++out.reduces; };
      Profiler::start(Device::cpu());
      std::vector<Tensor> y;
      if (together) {
        y = float8_grouped_mm(x, {a, b}, counts, count);
      } else {
        y = {float8_grouped_mm(x, a, counts, count), float8_grouped_mm(x, b, counts, count)};
      }
      for (const ProfiledOp& op : Profiler::stop().ops)
        out.casts += std::string(op.name) == "float8_rowwise_cast";
      out.forward_reduces = out.reduces;
      add(sum(mul(y[0], r1)), sum(mul(y[1], r3))).backward();
      out.values = {y[0], y[1], x.grad(), a.grad(), b.grad()};
      return out;
    };
    const Run separate = run(false), together = run(true);
    for (size_t i = 0; i < separate.values.size(); ++i) {
      EXPECT_EQ(together.values[i].to_vector<float>(), separate.values[i].to_vector<float>())
          << "value " << i;
    }
    // Forward casts per call: x by token, W, W^T (for dx), x per (expert, feature) for each of
    // the 2 experts with tokens; together, x's 3 casts are made once.
    EXPECT_EQ(separate.casts, 2 * (3 + 2));
    EXPECT_EQ(together.casts, separate.casts - 3);
    EXPECT_EQ(separate.forward_reduces, 2);
    EXPECT_EQ(together.forward_reduces, 1);
    EXPECT_EQ(together.reduces, 3);  // and each weight's output gradient in backward
  }
  const Tensor x = randn_as({16, 32}, DType::F32, 20, "x");
  EXPECT_THAT(error_of([&] {
                float8_grouped_mm(x, {randn_as({2, 16, 32}, DType::F32, 21),
                                      randn_as({3, 16, 32}, DType::F32, 22)},
                                  {16, 0});
              }),
              HasSubstr("every weight with the same G"));
  EXPECT_THAT(error_of([&] { float8_grouped_mm(x, std::vector<Tensor>{}, {16}); }),
              HasSubstr("no weights"));
}

// Close to the f32 grouped_mm (e4m3 keeps 3 mantissa bits), in f32 and bf16.
TEST(Float8GroupedMm, TracksTheHighPrecisionGroupedMm) {
  for (const DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = randn_as({48, 32}, dt, 10, "x");
    const Tensor w = randn_as({3, 48, 32}, dt, 11, "w");
    const Tensor y8 = float8_grouped_mm(x, w, kCounts);
    EXPECT_EQ(y8.dtype(), dt);
    const Tensor y = grouped_mm(x.to(DType::F32), w.to(DType::F32), kCounts);
    const double err = std::sqrt(sum(square(sub(y8.to(DType::F32), y))).item<double>());
    EXPECT_LT(err / std::sqrt(sum(square(y)).item<double>()), 0.06);
  }
}

TEST(Float8GroupedMm, BadOperandsAreErrors) {
  const Tensor x = randn_as({16, 24}, DType::F32, 1, "x");
  EXPECT_THAT(error_of([&] { float8_grouped_mm(x, randn_as({2, 16, 24}, DType::F32, 2), {16, 0}); }),
              HasSubstr("K = 24 and M = 16 must be multiples of 16"));
  const Tensor x16 = randn_as({16, 16}, DType::F32, 3, "x");
  const Tensor w = randn_as({2, 16, 16}, DType::F32, 4, "w");
  EXPECT_THAT(error_of([&] { float8_grouped_mm(x16, w, {10, 0}); }), HasSubstr("sum to 10"));
  EXPECT_THAT(error_of([&] { float8_grouped_mm(x16, w, {16}); }), HasSubstr("expected 2 group"));
  EXPECT_THAT(error_of([&] { float8_grouped_mm(x16.to(DType::F64), w, {16, 0}); }),
              HasSubstr("f32 or bf16"));
  EXPECT_THAT(error_of([&] { float8_grouped_mm(x16, w.select(0, 0), {16}); }),
              HasSubstr("w [G, M, K]"));
  EXPECT_FALSE(float8_grouped_mm_unsupported(Device::cpu(), 32, 48).has_value());
  EXPECT_TRUE(float8_grouped_mm_unsupported(Device::cpu(), 24, 48).has_value());
}

}  // namespace
}  // namespace mt::runtime
