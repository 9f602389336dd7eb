// softmax / log_softmax: values against a naive reference along every dim, stability with huge
// logits, 16-bit inputs, gradients against finite differences, errors.
#include "runtime/ops/softmax.h"

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

// Naive (log-)softmax along `dim` of a row-major copy of x, in f64.
Tensor naive_softmax(const Tensor& x, int64_t dim, bool log) {
  const std::vector<double> v = x.to_vector<double>();
  int64_t outer = 1, inner = 1;
  const int64_t n = x.size(dim);
  for (int64_t i = 0; i < dim; ++i) outer *= x.size(i);
  for (int64_t i = dim + 1; i < x.dim(); ++i) inner *= x.size(i);
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      auto at = [&](int64_t j) { return size_t((o * n + j) * inner + in); };
      double mx = -INFINITY, s = 0;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, v[at(j)]);
      for (int64_t j = 0; j < n; ++j) s += std::exp(v[at(j)] - mx);
      for (int64_t j = 0; j < n; ++j)
        out[at(j)] = log ? v[at(j)] - mx - std::log(s) : std::exp(v[at(j)] - mx) / s;
    }
  return from_vector<double>(out, x.shape(), TensorOptions{}.with_dtype(DType::F64));
}

TEST(Softmax, MatchesNaiveAlongEveryDim) {
  Tensor x = randn_as({3, 70, 5}, DType::F32, 1);  // inner blocks of 64 + 6 lanes for dim 0
  Tensor wide = randn_as({2, 130, 3}, DType::F32, 2).permute({0, 2, 1});  // strided input
  for (bool log : {false, true}) {
    for (int64_t d = -3; d < 3; ++d) {
      Tensor y = log ? log_softmax(x, d) : softmax(x, d);
      EXPECT_TRUE(all_close(y, naive_softmax(x, d < 0 ? d + 3 : d, log), 1e-6, 1e-5))
          << "dim " << d << " log " << log;
    }
    Tensor y = log ? log_softmax(wide, 1) : softmax(wide, 1);
    EXPECT_TRUE(all_close(y, naive_softmax(wide, 1, log), 1e-6, 1e-5));
  }
}

TEST(Softmax, StableWithHugeLogits) {
  Tensor x = from_vector<float>({1000.f, 1001.f, -1000.f, 1002.f}, {1, 4});
  const std::vector<double> y = softmax(x, -1).to_vector<double>();
  const double e = std::exp(1.0), denom = 1 + e + e * e;
  EXPECT_NEAR(y[0], 1 / denom, 1e-6);
  EXPECT_NEAR(y[2], 0.0, 1e-12);
  EXPECT_NEAR(y[3], e * e / denom, 1e-6);
  const std::vector<double> ly = log_softmax(x, -1).to_vector<double>();
  const double lse_shift = std::log(1 + std::exp(-1.0) + std::exp(-2.0));  // lse - 1002
  EXPECT_NEAR(ly[3], -lse_shift, 1e-5);
  EXPECT_NEAR(ly[2], -2002 - lse_shift, 1e-2);
  for (double v : ly) EXPECT_TRUE(std::isfinite(v));
}

TEST(Softmax, SixteenBitInputsComputeInF32) {
  for (DType dt : {DType::BF16, DType::F16}) {
    Tensor x = randn_as({4, 300}, dt, 3);
    Tensor y = softmax(x, 1), ly = log_softmax(x, 1);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_TRUE(all_close(y, naive_softmax(x, 1, false), 1e-4, 1e-2));
    EXPECT_TRUE(all_close(ly, naive_softmax(x, 1, true), 1e-4, 1e-2));
  }
}

TEST(Softmax, Gradcheck) {
  for (bool log : {false, true})
    for (int64_t d : {0, 1, -1}) {
      Tensor x = randn64({3, 4, 5}, 4);
      auto r = autograd::gradcheck(
          [&](const std::vector<Tensor>& in) {
            return log ? log_softmax(in[0], d) : softmax(in[0], d);
          },
          {x});
      EXPECT_TRUE(r.ok) << "dim " << d << " log " << log << "\n" << r.message;
    }
}

TEST(Softmax, GradcheckStridedInput) {
  Tensor x = randn64({5, 4}, 5, false).t().set_requires_grad(true);  // [4, 5], transposed
  ASSERT_FALSE(x.is_contiguous());
  for (bool log : {false, true}) {
    auto r = autograd::gradcheck(
        [&](const std::vector<Tensor>& in) {
          return log ? log_softmax(in[0], -1) : softmax(in[0], -1);
        },
        {x});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST(Softmax, Errors) {
  try {
    softmax(zeros({2, 3}), 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("softmax"), std::string::npos) << e.what();
  }
  EXPECT_THROW(log_softmax(zeros({2, 3}), -3), Error);
  EXPECT_THROW(softmax(zeros({2, 3}, TensorOptions{}.with_dtype(DType::I64)), 1), Error);
}

}  // namespace
}  // namespace mt::runtime
