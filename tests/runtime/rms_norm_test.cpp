// rms_norm: forward against a naive loop, gradcheck (f64, contiguous and strided inputs),
// 16-bit precision, thread-count independence of the backward, and errors.
#include "runtime/ops/rms_norm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "runtime/autograd/gradcheck.h"
#include "runtime/ops/factory.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::randn64;
using testing::randn_as;

// y[r, i] = x[r, i] / sqrt(mean_j x[r, j]^2 + eps) * w[i], in f64.
Tensor naive_rms_norm(const Tensor& x, const Tensor& w, double eps) {
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const size_t d = wv.size(), rows = xv.size() / d;
  std::vector<double> y(xv.size());
  for (size_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (size_t i = 0; i < d; ++i) ss += xv[r * d + i] * xv[r * d + i];
    const double rs = 1.0 / std::sqrt(ss / double(d) + eps);
    for (size_t i = 0; i < d; ++i) y[r * d + i] = xv[r * d + i] * rs * wv[i];
  }
  return from_vector<double>(y, x.shape(), TensorOptions{}.with_dtype(DType::F64));
}

TEST(RmsNorm, ForwardMatchesNaiveF64) {
  Tensor x = randn64({2, 3, 8}, 1, false), w = randn64({8}, 2, false);
  EXPECT_TRUE(all_close(rms_norm(x, w, 1e-5), naive_rms_norm(x, w, 1e-5), 1e-12, 1e-12));
}

TEST(RmsNorm, ForwardF32AndBf16AgreeWithF64Reference) {
  Tensor x = randn_as({5, 64}, DType::F32, 3), w = randn_as({64}, DType::F32, 4);
  const Tensor ref = naive_rms_norm(x, w, 1e-6);
  Tensor y32 = rms_norm(x, w);
  EXPECT_EQ(y32.dtype(), DType::F32);
  EXPECT_TRUE(all_close(y32, ref, 1e-5, 1e-5));
  Tensor xb = x.to(DType::BF16), wb = w.to(DType::BF16);
  Tensor yb = rms_norm(xb, wb);
  EXPECT_EQ(yb.dtype(), DType::BF16);
  // Computed in f32 from the bf16 inputs, rounded once: within one bf16 ulp of the reference.
  EXPECT_TRUE(all_close(yb, naive_rms_norm(xb, wb, 1e-6), 1e-3, 8e-3));
}

// The f32 and bf16 backward (vectorised rows; d = 100 leaves a remainder, 37 rows span several
// dweight blocks) against the f64 backward (gradchecked below) of the same input values.
TEST(RmsNorm, BackwardF32AndBf16AgreeWithF64) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const Tensor x0 = randn_as({37, 100}, dtype, 20), w0 = randn_as({100}, dtype, 21);
    const Tensor dy = randn_as({37, 100}, dtype, 22);
    std::vector<Tensor> grads[2];
    for (DType dt : {dtype, DType::F64}) {
      Tensor x = x0.to(dt).clone().set_requires_grad(true);
      Tensor w = w0.to(dt).clone().set_requires_grad(true);
      rms_norm(x, w, 1e-6).backward(dy.to(dt));
      grads[dt == DType::F64] = {x.grad(), w.grad()};
    }
    // f32: f32 rounding; bf16: computed in f32, rounded once (dx) or summed in f32 over the rows
    // and rounded once (dw): within about one bf16 ulp.
    const double tol = dtype == DType::F32 ? 1e-5 : 8e-3;
    EXPECT_EQ(grads[0][0].dtype(), dtype);
    EXPECT_TRUE(all_close(grads[0][0], grads[1][0], tol, tol)) << "dx";
    EXPECT_TRUE(all_close(grads[0][1], grads[1][1], tol, tol)) << "dw";
  }
}

TEST(RmsNorm, ZeroRowGivesZeros) {
  Tensor x = zeros({2, 4}, TensorOptions{}.with_dtype(DType::F64));
  Tensor w = randn64({4}, 5, false);
  EXPECT_TRUE(all_close(rms_norm(x, w, 1e-6), x, 0, 0));
}

TEST(RmsNorm, GradcheckContiguous) {
  Tensor x = randn64({3, 2, 5}, 10), w = randn64({5}, 11);
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], 1e-5); }, {x, w});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(RmsNorm, GradcheckStridedInputs) {
  // Leaves that are strided views (gradcheck reads the inputs' own .grad).
  Tensor x = randn64({6, 4}, 12, false).transpose(0, 1).set_requires_grad(true);   // [4, 6]
  Tensor w = randn64({12}, 13, false).slice(0, 0, 12, 2).set_requires_grad(true);  // stride 2
  ASSERT_FALSE(x.is_contiguous());
  ASSERT_FALSE(w.is_contiguous());
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], 1e-6); }, {x, w});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(RmsNorm, GradcheckOneInputRequiringGrad) {
  Tensor x = randn64({4, 3}, 14), w = randn64({3}, 15, false);
  auto r =
      autograd::gradcheck([&](const std::vector<Tensor>& in) { return rms_norm(in[0], w); }, {x});
  EXPECT_TRUE(r.ok) << r.message;
  Tensor x2 = randn64({4, 3}, 16, false), w2 = randn64({3}, 17);
  auto r2 =
      autograd::gradcheck([&](const std::vector<Tensor>& in) { return rms_norm(x2, in[0]); }, {w2});
  EXPECT_TRUE(r2.ok) << r2.message;
}

std::vector<uint32_t> bits_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint32_t> out(size_t(c.numel()));
  std::memcpy(out.data(), c.data<float>(), out.size() * 4);
  return out;
}

TEST(RmsNorm, BackwardIsBitIdenticalAcrossThreadCounts) {
  // 1037 rows (not a multiple of the row block) x 256: large enough to run in parallel.
  const Tensor x0 = randn_as({1037, 256}, DType::F32, 20), w0 = randn_as({256}, DType::F32, 21);
  const Tensor dy = randn_as({1037, 256}, DType::F32, 22);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<uint32_t>> dx_bits, dw_bits;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
    rms_norm(x, w).backward(dy);
    dx_bits.push_back(bits_of(x.grad()));
    dw_bits.push_back(bits_of(w.grad()));
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(dx_bits[0], dx_bits[1]);
  EXPECT_EQ(dw_bits[0], dw_bits[1]);
}

TEST(RmsNorm, F32GradientsMatchF64) {
  const Tensor x0 = randn_as({40, 32}, DType::F32, 30), w0 = randn_as({32}, DType::F32, 31);
  const Tensor dy = randn_as({40, 32}, DType::F32, 32);
  Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
  rms_norm(x, w).backward(dy);
  Tensor x64 = x0.to(DType::F64).set_requires_grad(true);
  Tensor w64 = w0.to(DType::F64).set_requires_grad(true);
  rms_norm(x64, w64).backward(dy.to(DType::F64));
  EXPECT_TRUE(all_close(x.grad(), x64.grad(), 1e-5, 1e-4));
  EXPECT_TRUE(all_close(w.grad(), w64.grad(), 1e-4, 1e-4));
}

TEST(RmsNorm, Errors) {
  Tensor x = randn64({2, 4}, 1, false);
  try {
    rms_norm(x, randn64({5}, 2, false));
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rms_norm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(rms_norm(x, randn64({4}, 2, false).to(DType::F32)), Error);  // dtype mismatch
  EXPECT_THROW(rms_norm(x, randn64({2, 4}, 2, false)), Error);              // 2-D weight
  EXPECT_THROW(rms_norm(x, randn64({4}, 2, false), -1.0), Error);           // negative eps
  EXPECT_THROW(rms_norm(x.to(DType::I64), ones({4}, TensorOptions{}.with_dtype(DType::I64))),
               Error);
}

}  // namespace
}  // namespace mt::runtime
