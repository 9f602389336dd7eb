// grouped_mm: equals a per-group loop of plain matmuls (both weight layouts, every dtype, empty
// groups, many small groups on OpenMP threads), f64 gradcheck, zero weight gradients of empty
// groups, grouped_mm_tn, counts as a tensor, and the error messages.
#include "runtime/ops/grouped_matmul.h"

#include <gtest/gtest.h>

#include <vector>

#include "runtime/autograd/gradcheck.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"
#include "runtime/ops/matmul.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::error_of;
using testing::randn64;
using testing::randn_as;

// The reference: y_g = x_g @ op(w[g]) with plain matmul, rows concatenated.
Tensor loop_reference(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts,
                      bool transpose_w) {
  const int64_t m = transpose_w ? w.size(1) : w.size(2);
  Tensor out = zeros({x.size(0), m}, x.options());
  int64_t row = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) {
      Tensor y = matmul(x.narrow(0, row, counts[g]), w.select(0, int64_t(g)), false, transpose_w);
      out.narrow(0, row, counts[g]).copy_(y);
    }
    row += counts[g];
  }
  return out;
}

TEST(GroupedMm, MatchesPerGroupLoopBothLayouts) {
  const std::vector<int64_t> counts{3, 0, 5, 1, 0, 4};
  Tensor x = randn64({13, 7}, 1, false);
  Tensor w_mk = randn64({6, 5, 7}, 2, false);  // [G, M, K]
  EXPECT_TRUE(
      all_close(grouped_mm(x, w_mk, counts), loop_reference(x, w_mk, counts, true), 1e-13, 1e-12));
  Tensor w_km = randn64({6, 7, 5}, 3, false);  // [G, K, M]
  EXPECT_TRUE(all_close(grouped_mm(x, w_km, counts, false), loop_reference(x, w_km, counts, false),
                        1e-13, 1e-12));
}

TEST(GroupedMm, F32AndBf16MatchLoop) {
  const std::vector<int64_t> counts{20, 0, 7, 37};
  Tensor x = randn_as({64, 24}, DType::F32, 4);
  Tensor w = randn_as({4, 16, 24}, DType::F32, 5);
  EXPECT_TRUE(all_close(grouped_mm(x, w, counts), loop_reference(x, w, counts, true), 1e-5, 1e-5));
  Tensor xb = x.to(DType::BF16), wb = w.to(DType::BF16);
  Tensor yb = grouped_mm(xb, wb, counts);
  EXPECT_EQ(yb.dtype(), DType::BF16);
  // f32 accumulation of the bf16 operands, rounded once.
  Tensor ref = loop_reference(xb.to(DType::F32), wb.to(DType::F32), counts, true);
  EXPECT_TRUE(all_close(yb, ref, 1e-2, 8e-3));
}

TEST(GroupedMm, ManySmallGroupsAndOneLargeGroup) {
  // 40 tiny groups (run concurrently on OpenMP threads) and one group above OpenBLAS's
  // single-thread bound (run alone).
  std::vector<int64_t> counts(41, 3);
  counts[17] = 0;
  counts[40] = 600;
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  Tensor x = randn_as({n, 32}, DType::F32, 6);
  Tensor w = randn_as({41, 24, 32}, DType::F32, 7);
  EXPECT_TRUE(all_close(grouped_mm(x, w, counts), loop_reference(x, w, counts, true), 1e-5, 1e-5));
}

TEST(GroupedMm, GradcheckF64BothLayouts) {
  const std::vector<int64_t> counts{2, 0, 3, 1};
  for (bool tw : {true, false}) {
    Tensor x = randn64({6, 4}, 8);
    Tensor w = tw ? randn64({4, 3, 4}, 9) : randn64({4, 4, 3}, 9);
    auto r = autograd::gradcheck(
        [counts, tw](const std::vector<Tensor>& in) {
          return grouped_mm(in[0], in[1], counts, tw);
        },
        {x, w});
    EXPECT_TRUE(r.ok) << (tw ? "[G, M, K]: " : "[G, K, M]: ") << r.message;
  }
}

TEST(GroupedMm, EmptyGroupsGetZeroWeightGradient) {
  const std::vector<int64_t> counts{0, 4, 0};
  Tensor x = randn64({4, 3}, 10);
  Tensor w = randn64({3, 2, 3}, 11);
  Tensor y = grouped_mm(x, w, counts);
  y.backward(ones(y.shape(), y.options()));
  const Tensor dw = w.grad();
  ASSERT_TRUE(dw.defined());
  EXPECT_TRUE(all_close(dw.select(0, 0), zeros({2, 3}, dw.options()), 0, 0));
  EXPECT_TRUE(all_close(dw.select(0, 2), zeros({2, 3}, dw.options()), 0, 0));
  // Group 1: dW = dy^T x with dy = ones.
  EXPECT_TRUE(all_close(dw.select(0, 1), matmul(ones({4, 2}, x.options()), x.detach(), true), 1e-13,
                        1e-12));
}

TEST(GroupedMm, NoRowsAtAllAndZeroK) {
  Tensor x = zeros({0, 3}, TensorOptions{}.with_dtype(DType::F64).with_requires_grad(true));
  Tensor w = randn64({2, 4, 3}, 12);
  Tensor y = grouped_mm(x, w, std::vector<int64_t>{0, 0});
  EXPECT_EQ(y.shape(), (Shape{0, 4}));
  Tensor xk = zeros({3, 0}, TensorOptions{}.with_dtype(DType::F64));
  Tensor wk = zeros({2, 4, 0}, TensorOptions{}.with_dtype(DType::F64));
  EXPECT_TRUE(
      all_close(grouped_mm(xk, wk, std::vector<int64_t>{1, 2}), zeros({3, 4}, xk.options()), 0, 0));
}

TEST(GroupedMm, TnIsPerGroupTransposedProduct) {
  const std::vector<int64_t> counts{2, 0, 3};
  Tensor a = randn64({5, 4}, 13, false), b = randn64({5, 3}, 14, false);
  Tensor out = grouped_mm_tn(a, b, counts);
  ASSERT_EQ(out.shape(), (Shape{3, 4, 3}));
  EXPECT_TRUE(all_close(out.select(0, 0), matmul(a.narrow(0, 0, 2), b.narrow(0, 0, 2), true), 1e-13,
                        1e-12));
  EXPECT_TRUE(all_close(out.select(0, 1), zeros({4, 3}, a.options()), 0, 0));
  EXPECT_TRUE(all_close(out.select(0, 2), matmul(a.narrow(0, 2, 3), b.narrow(0, 2, 3), true), 1e-13,
                        1e-12));
}

TEST(GroupedMm, CountsAsTensor) {
  Tensor x = randn64({5, 4}, 15, false), w = randn64({2, 3, 4}, 16, false);
  Tensor c = from_vector<int64_t>({3, 2}, {2}, TensorOptions{}.with_dtype(DType::I64));
  EXPECT_TRUE(all_close(grouped_mm(x, w, c), grouped_mm(x, w, std::vector<int64_t>{3, 2}), 0, 0));
}

TEST(GroupedMm, ErrorsNameTheProblem) {
  Tensor x = randn64({5, 4}, 17, false), w = randn64({2, 3, 4}, 18, false);
  EXPECT_NE(error_of([&] {
              grouped_mm(x, w, std::vector<int64_t>{3, 3});
            }).find("sum to 6 but the input has 5 rows"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { grouped_mm(x, w, std::vector<int64_t>{5}); }).find("expected 2 group counts"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              grouped_mm(x, w, std::vector<int64_t>{6, -1});
            }).find("negative row count -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              grouped_mm(x, randn64({2, 3, 5}, 19, false), {3, 2});
            }).find("has 4 columns"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              grouped_mm(x, w.to(DType::F32), {3, 2});
            }).find("one floating dtype"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::runtime
