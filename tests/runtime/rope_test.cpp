// RoPE: frequency tables (known Llama 3 / 3.1 values), rotation of interleaved pairs against a
// naive loop, position offsets, gradcheck (the backward is the inverse rotation), errors.
#include "runtime/ops/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>

#include "runtime/autograd/gradcheck.h"
#include "runtime/kernels/rope.h"
#include "runtime/ops/factory.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::randn64;
using testing::randn_as;

// The frequency of pair i recovered from the tables at position 1 (angles there are < pi).
double freq_from_tables(const RopeTables& t, int64_t i) {
  const int64_t half = t.cos.shape()[1];
  return std::atan2(t.sin.to_vector<double>()[half + i], t.cos.to_vector<double>()[half + i]);
}

TEST(Rope, UnscaledFrequenciesLlama3) {
  const RopeTables t = rope_frequencies(128, 16, 500000.0);
  ASSERT_EQ(t.cos.shape(), (Shape{16, 64}));
  EXPECT_EQ(t.cos.dtype(), DType::F32);
  const auto c = t.cos.to_vector<double>(), s = t.sin.to_vector<double>();
  for (int64_t p = 0; p < 16; ++p) {
    for (int64_t i = 0; i < 64; ++i) {
      const double a = double(p) * std::pow(500000.0, -double(2 * i) / 128.0);
      EXPECT_NEAR(c[p * 64 + i], std::cos(a), 1e-7);
      EXPECT_NEAR(s[p * 64 + i], std::sin(a), 1e-7);
    }
  }
  EXPECT_NEAR(freq_from_tables(t, 0), 1.0, 1e-7);
  EXPECT_NEAR(freq_from_tables(t, 32), 1.0 / std::sqrt(500000.0), 3e-10);  // theta^(-1/2)
}

TEST(Rope, Llama31ScaledFrequencies) {
  // Known values of Meta's apply_scaling (factor 8, low 1, high 4, original 8192) for
  // theta = 500000 and head_dim 128: pairs 0..28 keep their frequency (wavelength < 2048),
  // pairs 29..34 are interpolated, pairs 35..63 are divided by 8 (wavelength > 8192).
  const RopeTables t = rope_frequencies(128, 2, 500000.0, RopeScaling{8.0, 1.0, 4.0, 8192});
  const std::vector<std::pair<int64_t, double>> known = {{0, 1.0},
                                                         {16, 0.03760603093086393},
                                                         {28, 0.0032114459947525913},
                                                         {29, 0.002166570763503359},
                                                         {32, 0.0005248461609929547},
                                                         {34, 0.00017850781276799638},
                                                         {36, 7.78465527393245e-05},
                                                         {48, 6.647869871181236e-06},
                                                         {63, 3.068925988914511e-07}};
  for (const auto& [i, f] : known) EXPECT_NEAR(freq_from_tables(t, i), f, 2e-7 * f) << "pair " << i;
}

// out[b, t, h, 2i..2i+1] = rotation of the pair by (offset + t) * freq_i, from the tables.
Tensor naive_rope(const Tensor& x, const RopeTables& t, int64_t offset) {
  const auto xv = x.to_vector<double>();
  const auto c = t.cos.to_vector<double>(), s = t.sin.to_vector<double>();
  const Shape& sh = x.shape();
  const int64_t half = sh[3] / 2;
  std::vector<double> out(xv.size());
  for (int64_t b = 0; b < sh[0]; ++b)
    for (int64_t tok = 0; tok < sh[1]; ++tok)
      for (int64_t h = 0; h < sh[2]; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const int64_t base = ((b * sh[1] + tok) * sh[2] + h) * sh[3] + 2 * i;
          const double cs = c[(offset + tok) * half + i], sn = s[(offset + tok) * half + i];
          out[base] = xv[base] * cs - xv[base + 1] * sn;
          out[base + 1] = xv[base] * sn + xv[base + 1] * cs;
        }
  return from_vector<double>(out, sh, TensorOptions{}.with_dtype(DType::F64));
}

TEST(Rope, ApplyMatchesNaiveWithOffset) {
  const RopeTables t = rope_frequencies(8, 16, 10000.0);
  Tensor x = randn64({2, 5, 3, 8}, 1, false);
  EXPECT_TRUE(all_close(apply_rope(x, t.cos, t.sin, 3), naive_rope(x, t, 3), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(apply_rope(x, t.cos, t.sin), naive_rope(x, t, 0), 1e-12, 1e-12));
  // Position 0 is the identity.
  Tensor x1 = randn64({1, 1, 2, 8}, 2, false);
  EXPECT_TRUE(all_close(apply_rope(x1, t.cos, t.sin), x1, 1e-15, 0));
}

TEST(Rope, MatchesComplexMultiplication) {
  // Meta's formulation: view pairs as complex numbers and multiply by exp(i * p * freq).
  const int64_t hd = 4;
  const RopeTables t = rope_frequencies(hd, 8, 10000.0);
  Tensor x = randn64({1, 8, 1, hd}, 3, false);
  const auto xv = x.to_vector<double>();
  const auto out = apply_rope(x, t.cos, t.sin).to_vector<double>();
  for (int64_t p = 0; p < 8; ++p)
    for (int64_t i = 0; i < hd / 2; ++i) {
      const std::complex<double> z(xv[p * hd + 2 * i], xv[p * hd + 2 * i + 1]);
      const std::complex<double> r =
          z * std::polar(1.0, double(p) * std::pow(10000.0, -double(2 * i) / double(hd)));
      EXPECT_NEAR(out[p * hd + 2 * i], r.real(), 1e-6);
      EXPECT_NEAR(out[p * hd + 2 * i + 1], r.imag(), 1e-6);
    }
}

TEST(Rope, F32AndBf16) {
  const RopeTables t = rope_frequencies(16, 32, 500000.0);
  Tensor x = randn_as({2, 7, 2, 16}, DType::F32, 4);
  Tensor y = apply_rope(x, t.cos, t.sin, 5);
  EXPECT_EQ(y.dtype(), DType::F32);
  EXPECT_TRUE(all_close(y, naive_rope(x, t, 5), 1e-6, 1e-6));
  Tensor xb = x.to(DType::BF16);
  Tensor yb = apply_rope(xb, t.cos, t.sin, 5);
  EXPECT_EQ(yb.dtype(), DType::BF16);
  EXPECT_TRUE(all_close(yb, naive_rope(xb, t, 5), 1e-2, 1e-2));
}

TEST(Rope, GradcheckStridedInput) {
  const RopeTables t = rope_frequencies(6, 12, 10000.0);
  // [B, H, T, hd] storage viewed as [B, T, H, hd]: a non-contiguous leaf.
  Tensor x = randn64({2, 3, 4, 6}, 5, false).transpose(1, 2).set_requires_grad(true);
  ASSERT_FALSE(x.is_contiguous());
  auto r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return apply_rope(in[0], t.cos, t.sin, 2); }, {x});
  EXPECT_TRUE(r.ok) << r.message;
}

// Token-strided input, as the q and k columns of a joined q/k/v projection: read in place
// (rope_reads_in_place), the same output as its contiguous copy, and gradcheck through the view.
TEST(Rope, ReadsTheColumnsOfAJoinedProjectionInPlace) {
  const RopeTables t = rope_frequencies(6, 12, 10000.0);
  const Tensor joined = randn64({2, 4, 3 * 6 + 10}, 7, false);  // [B, T, H * hd + more]
  const Tensor x = joined.narrow(2, 10, 3 * 6).view({2, 4, 3, 6});
  ASSERT_FALSE(x.is_contiguous());
  EXPECT_TRUE(rope_reads_in_place(x));
  EXPECT_FALSE(rope_reads_in_place(randn64({2, 3, 4, 6}, 8, false).transpose(1, 2)));
  EXPECT_TRUE(all_close(apply_rope(x, t.cos, t.sin, 2), apply_rope(x.contiguous(), t.cos, t.sin, 2),
                        0, 0));
  EXPECT_TRUE(all_close(apply_rope(x, t.cos, t.sin, 2), naive_rope(x, t, 2), 1e-6, 1e-6));
  auto r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return apply_rope(in[0].narrow(2, 10, 3 * 6).view({2, 4, 3, 6}), t.cos, t.sin, 2);
      },
      {joined.detach().clone().set_requires_grad(true)});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Rope, BackwardIsInverseRotation) {
  // The rotation is orthogonal: backpropagating the output itself gives back x.
  const RopeTables t = rope_frequencies(8, 16, 10000.0);
  Tensor x = randn64({1, 6, 2, 8}, 6);
  Tensor y = apply_rope(x, t.cos, t.sin, 4);
  y.backward(y.detach());
  // Exact up to the f32 tables: cos^2 + sin^2 = 1 within ~1e-7.
  EXPECT_TRUE(all_close(x.grad(), x.detach(), 1e-6, 1e-6));
}

TEST(Rope, Errors) {
  const RopeTables t = rope_frequencies(8, 4, 10000.0);
  try {
    apply_rope(randn64({1, 3, 2, 8}, 1, false), t.cos, t.sin, 2);  // positions [2, 5) > 4
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("apply_rope"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_seq_len 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(apply_rope(randn64({1, 3, 2, 6}, 1, false), t.cos, t.sin), Error);  // table size
  EXPECT_THROW(apply_rope(randn64({1, 3, 2, 7}, 1, false), t.cos, t.sin), Error);  // odd
  EXPECT_THROW(apply_rope(randn64({3, 2, 8}, 1, false), t.cos, t.sin), Error);     // 3-D
  EXPECT_THROW(apply_rope(randn64({1, 2, 2, 8}, 1, false), t.cos, t.sin, -1), Error);
  EXPECT_THROW(apply_rope(randn64({1, 2, 2, 8}, 1, false), t.cos, t.sin.narrow(0, 0, 2)), Error);
  EXPECT_THROW(rope_frequencies(7, 4), Error);
  EXPECT_THROW(rope_frequencies(8, 4, -1.0), Error);
  EXPECT_THROW(rope_frequencies(8, 4, 10000.0, RopeScaling{8.0, 4.0, 1.0, 8192}), Error);
}

}  // namespace
}  // namespace mt::runtime
