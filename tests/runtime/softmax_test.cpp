// softmax / log_softmax: values against a naive reference along every dim, stability with huge
// logits, 16-bit inputs, gradients against finite differences, errors.
#include "runtime/ops/softmax.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "runtime/autograd/gradcheck.h"
#include "runtime/cpu/vec_math.h"
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
  EXPECT_NEAR(ly[3], -lse_shift, 1e-4);  // f32 lse near 1002: ulp 6e-5
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

// The f32 and 16-bit kernels (vectorised f32 rows) against the f64 kernel on the same values.
TEST(Softmax, LowPrecisionBackwardMatchesF64) {
  for (DType dt : {DType::F32, DType::BF16})
    for (bool log : {false, true}) {
      Tensor x = randn_as({5, 257}, dt, 6).set_requires_grad(true);
      Tensor x64 = x.detach().to(DType::F64).set_requires_grad(true);
      Tensor g64 = randn64({5, 257}, 7, false);
      (log ? log_softmax(x, -1) : softmax(x, -1)).backward(g64.to(dt));
      (log ? log_softmax(x64, -1) : softmax(x64, -1)).backward(g64.to(dt).to(DType::F64));
      const double tol = dt == DType::F32 ? 1e-5 : 2e-2;
      EXPECT_TRUE(all_close(x.grad(), x64.grad(), tol, tol)) << dtype_name(dt) << " log " << log;
    }
}

// exp_f32 (the vectorised exp behind the f32 rows) against std::exp in f64, and its edge cases.
// row_max (vectorised: the softmax, cross-entropy and attention rows' shift): the maximum, and NaN
// for a NaN anywhere, in the vector body or the tail, for lengths around the vector widths.
TEST(Softmax, RowMaxFindsTheMaximumAndAnyNan) {
  EXPECT_EQ(cpu::row_max(nullptr, 0), -INFINITY);
  for (int64_t n : {1, 7, 8, 9, 16, 17, 64, 67}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float((i * 37) % 11) - 5.0f - 0.25f * float(i);
    EXPECT_EQ(cpu::row_max(x.data(), n), *std::max_element(x.begin(), x.end())) << n;
    std::vector<float> neg(x.size(), -INFINITY);
    EXPECT_EQ(cpu::row_max(neg.data(), n), -INFINITY) << n;
    for (int64_t at : {int64_t(0), n / 2, n - 1}) {
      std::vector<float> y = x;
      y[size_t(at)] = NAN;
      EXPECT_TRUE(std::isnan(cpu::row_max(y.data(), n))) << n << " NaN at " << at;
    }
  }
}

TEST(Softmax, ExpF32IsAccurate) {
  const int64_t n = 100001;
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -87.0f + 175.0f * float(i) / float(n - 1);
  cpu::row_exp_scale(x.data(), n, 0.0f, 1.0f, y.data());
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double ref = std::exp(double(x[i]));
    if (ref > 3.4e38) continue;
    worst = std::max(worst, std::abs(y[i] - ref) / ref);
  }
  EXPECT_LT(worst, 2.5e-7);  // about 2 ulp
  std::vector<float> edge = {-INFINITY, INFINITY, NAN, -200.0f, 0.0f, 89.0f};
  std::vector<float> out(edge.size());
  cpu::row_exp_scale(edge.data(), int64_t(edge.size()), 0.0f, 1.0f, out.data());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], INFINITY);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(out[4], 1.0f);
  EXPECT_EQ(out[5], INFINITY);
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
