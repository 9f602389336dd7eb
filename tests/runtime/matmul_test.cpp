// matmul and linear: values against a naive triple loop (2-D, batched, broadcast batch dims,
// every transpose combination, strided inputs, f64, bf16), gradients against finite differences,
// and error messages.
#include "runtime/ops/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "runtime/autograd/gradcheck.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::randn64;
using testing::randn_as;

// Reference op(a) @ op(b) by plain loops over host values, with numpy batch broadcasting.
Tensor naive_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  const int64_t ra = a.size(-2), ca = a.size(-1), rb = b.size(-2), cb = b.size(-1);
  const int64_t M = ta ? ca : ra, K = ta ? ra : ca, N = tb ? rb : cb;
  const Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  const Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  const size_t nd = std::max(a_batch.size(), b_batch.size());
  Shape pa(nd - a_batch.size(), 1), pb(nd - b_batch.size(), 1), batch(nd);
  pa.insert(pa.end(), a_batch.begin(), a_batch.end());
  pb.insert(pb.end(), b_batch.begin(), b_batch.end());
  for (size_t d = 0; d < nd; ++d) batch[d] = std::max(pa[d], pb[d]);
  const int64_t nb = numel_of(batch);
  std::vector<double> out(size_t(nb * M * N), 0.0);
  for (int64_t t = 0; t < nb; ++t) {
    int64_t ia = 0, ib = 0, rem = t, sa = 1, sb = 1;
    for (int64_t d = int64_t(nd) - 1; d >= 0; --d) {
      const int64_t idx = rem % batch[d];
      rem /= batch[d];
      ia += (pa[d] == 1 ? 0 : idx) * sa;
      ib += (pb[d] == 1 ? 0 : idx) * sb;
      sa *= pa[d];
      sb *= pb[d];
    }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double x = va[ia * ra * ca + (ta ? k * ca + i : i * ca + k)];
          const double y = vb[ib * rb * cb + (tb ? j * cb + k : k * cb + j)];
          s += x * y;
        }
        out[(t * M + i) * N + j] = s;
      }
  }
  Shape shape = batch;
  shape.push_back(M);
  shape.push_back(N);
  return from_vector<double>(out, shape, TensorOptions{}.with_dtype(DType::F64));
}

std::string str(const Shape& s) { return mt::detail::concat(s); }

Shape raw_shape(Shape batch, int64_t rows, int64_t cols, bool transposed) {
  batch.push_back(transposed ? cols : rows);
  batch.push_back(transposed ? rows : cols);
  return batch;
}

TEST(Matmul, TwoDMatchesNaiveF32) {
  Tensor a = randn_as({5, 7}, DType::F32, 1), b = randn_as({7, 3}, DType::F32, 2);
  Tensor c = matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::F32);
  EXPECT_TRUE(all_close(c, naive_matmul(a, b, false, false), 1e-5, 1e-5));
}

TEST(Matmul, AllTransposeCombinationsF64) {
  const int64_t M = 13, K = 9, N = 6;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Tensor a = randn64(raw_shape({}, M, K, ta), 3, false);
      Tensor b = randn64(raw_shape({}, K, N, tb), 4, false);
      Tensor c = matmul(a, b, ta, tb);
      EXPECT_EQ(c.shape(), (Shape{M, N}));
      EXPECT_TRUE(all_close(c, naive_matmul(a, b, ta, tb), 1e-12, 1e-12)) << ta << tb;
    }
}

TEST(Matmul, BatchedAndBroadcastBatchDims) {
  struct Case {
    Shape a_batch, b_batch;
  };
  const std::vector<Case> cases = {{{3}, {3}}, {{2, 3}, {3}},    {{}, {4}},
                                   {{4}, {}},  {{2, 1}, {1, 3}}, {{1}, {2, 3}}};
  for (const Case& cs : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Tensor a = randn_as(raw_shape(cs.a_batch, 4, 5, ta), DType::F32, 5);
        Tensor b = randn_as(raw_shape(cs.b_batch, 5, 3, tb), DType::F32, 6);
        EXPECT_TRUE(all_close(matmul(a, b, ta, tb), naive_matmul(a, b, ta, tb), 1e-5, 1e-5))
            << str(a.shape()) << " x " << str(b.shape()) << " ta " << ta << " tb " << tb;
      }
}

TEST(Matmul, StridedAndBroadcastOperands) {
  Tensor base = randn_as({2, 8, 10}, DType::F32, 7);
  Tensor a = base.slice(1, 0, 8, 2);  // [2, 4, 10], rows step 2: BLAS lda = 20
  Tensor bt = randn_as({10, 6}, DType::F32, 8);
  Tensor b = bt.slice(1, 0, 6, 2);  // [10, 3], column stride 2: copied
  Tensor row = randn_as({1, 3}, DType::F32, 9);
  Tensor bexp = row.expand({10, 3});                                       // row stride 0: copied
  Tensor aperm = randn_as({10, 2, 4}, DType::F32, 10).permute({1, 2, 0});  // [2, 4, 10]
  ASSERT_FALSE(a.is_contiguous());
  ASSERT_FALSE(b.is_contiguous());
  ASSERT_FALSE(aperm.is_contiguous());
  EXPECT_TRUE(all_close(matmul(a, b), naive_matmul(a, b, false, false), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(matmul(a, bexp), naive_matmul(a, bexp, false, false), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(matmul(aperm, b), naive_matmul(aperm, b, false, false), 1e-5, 1e-5));
  // A transposed view with the flag set reads the original layout again.
  Tensor w = randn_as({3, 10}, DType::F32, 11);
  EXPECT_TRUE(all_close(matmul(a, w.t(), false, false), matmul(a, w, false, true), 0, 0));
}

TEST(Matmul, Bf16AccumulatesInF32) {
  Tensor a = randn_as({2, 16, 64}, DType::BF16, 12), b = randn_as({64, 24}, DType::BF16, 13);
  Tensor c = matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::BF16);
  // Exact inputs, f32 accumulation, one rounding to bf16 (relative 2^-8).
  EXPECT_TRUE(all_close(c, naive_matmul(a, b, false, false), 2e-2, 8e-3));
  Tensor ha = randn_as({8, 32}, DType::F16, 14), hb = randn_as({24, 32}, DType::F16, 15);
  Tensor h = matmul(ha, hb, false, true);
  EXPECT_EQ(h.dtype(), DType::F16);
  EXPECT_TRUE(all_close(h, naive_matmul(ha, hb, false, true), 1e-2, 2e-3));
}

TEST(Matmul, VectorsFollowNumpy) {
  Tensor v = randn64({5}, 16, false), m = randn64({5, 3}, 17, false);
  Tensor mv = randn64({4, 5}, 18, false), bm = randn64({2, 5, 3}, 19, false);
  Tensor vm = matmul(v, m);
  EXPECT_EQ(vm.shape(), (Shape{3}));
  EXPECT_TRUE(all_close(vm, naive_matmul(v.unsqueeze(0), m, false, false).squeeze(0)));
  Tensor mvv = matmul(mv, v);
  EXPECT_EQ(mvv.shape(), (Shape{4}));
  EXPECT_TRUE(all_close(mvv, naive_matmul(mv, v.unsqueeze(1), false, false).squeeze(1)));
  Tensor dot = matmul(v, v);
  EXPECT_EQ(dot.dim(), 0);
  double expect = 0;
  for (double x : v.to_vector<double>()) expect += x * x;
  EXPECT_NEAR(dot.item<double>(), expect, 1e-12);
  EXPECT_EQ(matmul(v, bm).shape(), (Shape{2, 3}));
}

TEST(Matmul, EmptyInnerDimGivesZeros) {
  Tensor c = matmul(zeros({3, 0}), zeros({0, 2}));
  EXPECT_EQ(c.shape(), (Shape{3, 2}));
  EXPECT_EQ(c.to_vector<double>(), std::vector<double>(6, 0.0));
}

TEST(Matmul, GradcheckTwoDAllTransposes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Tensor a = randn64(raw_shape({}, 3, 4, ta), 20), b = randn64(raw_shape({}, 4, 2, tb), 21);
      auto r = autograd::gradcheck(
          [&](const std::vector<Tensor>& in) { return matmul(in[0], in[1], ta, tb); }, {a, b});
      EXPECT_TRUE(r.ok) << "ta " << ta << " tb " << tb << "\n" << r.message;
    }
}

TEST(Matmul, GradcheckBroadcastBatch) {
  struct Case {
    Shape a_batch, b_batch;
  };
  // Shared right operand (folded GEMM), shared left operand, partial broadcast, full batches.
  const std::vector<Case> cases = {{{2, 2}, {}}, {{}, {3}}, {{2, 1}, {1, 2}}, {{2}, {2}}};
  for (const Case& cs : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Tensor a = randn64(raw_shape(cs.a_batch, 2, 3, ta), 22);
        Tensor b = randn64(raw_shape(cs.b_batch, 3, 2, tb), 23);
        auto r = autograd::gradcheck(
            [&](const std::vector<Tensor>& in) { return matmul(in[0], in[1], ta, tb); }, {a, b});
        EXPECT_TRUE(r.ok) << str(a.shape()) << " x " << str(b.shape()) << " ta " << ta << " tb "
                          << tb << "\n"
                          << r.message;
      }
}

TEST(Matmul, GradcheckStridedInputsAndVectors) {
  Tensor a = randn64({3, 5}, 24, false).t().set_requires_grad(true);  // [5, 3], transposed view
  Tensor b = randn64({3, 8}, 25, false).slice(1, 0, 8, 2).set_requires_grad(true);  // [3, 4]
  ASSERT_FALSE(a.is_contiguous());
  ASSERT_FALSE(b.is_contiguous());
  auto r = autograd::gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
                               {a, b});
  EXPECT_TRUE(r.ok) << r.message;
  Tensor v = randn64({3}, 26), m = randn64({2, 3, 4}, 27);
  auto rv = autograd::gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
                                {v, m});
  EXPECT_TRUE(rv.ok) << rv.message;
}

TEST(Linear, MatchesMatmulPlusBias) {
  Tensor x = randn64({2, 3, 4}, 28, false), w = randn64({5, 4}, 29, false);
  Tensor bias = randn64({5}, 30, false);
  Tensor y = linear(x, w, bias);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
  const std::vector<double> ref = naive_matmul(x, w, false, true).to_vector<double>();
  const std::vector<double> vb = bias.to_vector<double>(), vy = y.to_vector<double>();
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(vy[i], ref[i] + vb[i % 5], 1e-12);
  EXPECT_TRUE(all_close(linear(x, w), naive_matmul(x, w, false, true), 1e-12, 1e-12));
  EXPECT_EQ(linear(randn64({4}, 31, false), w).shape(), (Shape{5}));
}

TEST(Linear, Gradcheck) {
  Tensor x = randn64({2, 3, 4}, 32), w = randn64({5, 4}, 33), bias = randn64({5}, 34);
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, bias});
  EXPECT_TRUE(r.ok) << r.message;
  Tensor xt = randn64({4, 3}, 35, false).t().set_requires_grad(true);  // [3, 4], strided
  auto r2 = autograd::gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); },
                                {xt, w});
  EXPECT_TRUE(r2.ok) << r2.message;
}

TEST(Matmul, Errors) {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  try {
    matmul(a, b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 5]"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(matmul(a, zeros({5, 3}), false, true));
  EXPECT_THROW(matmul(zeros({2, 2, 3}), zeros({3, 3, 4})), Error);  // batch 2 vs 3
  EXPECT_THROW(matmul(a, zeros({3, 4}, TensorOptions{}.with_dtype(DType::F64))), Error);
  EXPECT_THROW(matmul(zeros({2, 3}, TensorOptions{}.with_dtype(DType::I64)),
                      zeros({3, 4}, TensorOptions{}.with_dtype(DType::I64))),
               Error);
  EXPECT_THROW(matmul(zeros({}), a), Error);
  EXPECT_THROW(linear(zeros({2, 3}), zeros({4, 5})), Error);
  EXPECT_THROW(linear(zeros({2, 3}), zeros({4, 3}), zeros({3})), Error);
}

}  // namespace
}  // namespace mt::runtime
