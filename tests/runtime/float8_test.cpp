// Float8 numerics on the CPU reference: the scalar e4m3/e5m2 conversions against a brute-force
// nearest-value search over every code (ties to even, saturation, subnormals, NaN), tensorwise
// and rowwise (power-of-two) scaling, the scaled GEMM against f64 products of the decoded values, float8_linear's forward
// and both gradients against the same products built by hand, the fallbacks and errors, and the
// module conversion with its filter.
#include "runtime/ops/float8.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>

#include "runtime/core/profiler.h"
#include "runtime/nn/float8_conversion.h"
#include "runtime/nn/linear.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
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

constexpr Float8Format kFormats[] = {Float8Format::E4M3, Float8Format::E5M2};

bool is_nan_code(uint8_t code, Float8Format f) { return std::isnan(float8_to_float(code, f)); }

// The code nearest to v among every finite code (ties to the even code, i.e. mantissa LSB 0),
// saturating: the oracle, by exhaustive search in f64.
uint8_t nearest_code(float v, Float8Format f) {
  const double max = float8_max(f);
  const double x = std::min(std::max(double(v), -max), max);
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < 256; ++c) {
    const float d = float8_to_float(uint8_t(c), f);
    if (!std::isfinite(d) || (d == 0 && std::signbit(d) != std::signbit(x))) continue;
    const double dist = std::abs(double(d) - x);
    if (best < 0 || dist < best_d || (dist == best_d && (c & 1) == 0)) {
      best = c;
      best_d = dist;
    }
  }
  return uint8_t(best);
}

TEST(Float8Format, EveryCodeDecodesAndEncodesBack) {
  for (Float8Format f : kFormats) {
    for (int c = 0; c < 256; ++c) {
      const uint8_t code = uint8_t(c);
      const float v = float8_to_float(code, f);
      if (is_nan_code(code, f)) {
        EXPECT_TRUE(is_nan_code(float_to_float8(v, f), f)) << float8_format_name(f) << " " << c;
      } else if (std::isinf(v)) {  // e5m2's infinities saturate to the largest finite value
        EXPECT_EQ(float_to_float8(v, f), (code & 0x80) | 0x7b) << c;
      } else {
        EXPECT_EQ(float_to_float8(v, f), code) << float8_format_name(f) << " code " << c;
      }
    }
  }
}

TEST(Float8Format, KnownValues) {
  const auto e4m3 = [](float v) { return int(float_to_float8(v, Float8Format::E4M3)); };
  const auto e5m2 = [](float v) { return int(float_to_float8(v, Float8Format::E5M2)); };
  EXPECT_EQ(e4m3(1.0f), 0x38);
  EXPECT_EQ(e4m3(-2.0f), 0xc0);
  EXPECT_EQ(e4m3(448.0f), 0x7e);
  EXPECT_EQ(e4m3(1000.0f), 0x7e);                                     // saturates
  EXPECT_EQ(e4m3(-std::numeric_limits<float>::infinity()), 0xfe);     // saturates
  EXPECT_EQ(e4m3(std::ldexp(1.0f, -9)), 0x01);                        // smallest subnormal
  EXPECT_EQ(e4m3(std::ldexp(1.0f, -10)), 0x00);                       // tie: to even (zero)
  EXPECT_EQ(e4m3(std::ldexp(3.0f, -10)), 0x02);                       // tie 1.5 steps: to 2
  EXPECT_EQ(e4m3(std::ldexp(1.0f, -6)), 0x08);                        // smallest normal
  EXPECT_EQ(e4m3(1.0625f), 0x38);                                     // tie: to 1.0 (even)
  EXPECT_EQ(e4m3(1.1875f), 0x3a);                                     // tie: to 1.25 (even)
  EXPECT_EQ(e4m3(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_EQ(e5m2(1.0f), 0x3c);
  EXPECT_EQ(e5m2(57344.0f), 0x7b);
  EXPECT_EQ(e5m2(1e6f), 0x7b);
  EXPECT_EQ(e5m2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_FLOAT_EQ(float8_to_float(0x7e, Float8Format::E4M3), 448.0f);
  EXPECT_FLOAT_EQ(float8_to_float(0x01, Float8Format::E5M2), std::ldexp(1.0f, -16));
  EXPECT_TRUE(std::isinf(float8_to_float(0x7c, Float8Format::E5M2)));
}

TEST(Float8Format, RoundsToTheNearestCodeAsAnExhaustiveSearchDoes) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-22.0f, 18.0f), mantissa(1.0f, 2.0f);
  for (Float8Format f : kFormats) {
    for (int i = 0; i < 20000; ++i) {
      float v = std::ldexp(mantissa(rng), int(exponent(rng)));
      if (i % 2) v = -v;
      ASSERT_EQ(int(float_to_float8(v, f)), int(nearest_code(v, f)))
          << float8_format_name(f) << " of " << v;
    }
    for (int c = 0; c < 255; ++c) {  // midpoints between neighbouring positive codes: ties
      const float lo = float8_to_float(uint8_t(c), f), hi = float8_to_float(uint8_t(c + 1), f);
      if (!std::isfinite(hi) || c + 1 > 0x7f) break;
      const float mid = float((double(lo) + double(hi)) / 2);
      ASSERT_EQ(int(float_to_float8(mid, f)), int(nearest_code(mid, f)))
          << float8_format_name(f) << " midpoint of codes " << c << ", " << c + 1;
    }
  }
}

TEST(Float8Cast, ScalesByTheAmaxAndWritesBothLayouts) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (Float8Format f : kFormats) {
      const Tensor x = randn_as({37, 53}, dtype, 3, "x");
      const Float8Tensor q = to_float8(x, f, true, true);
      const std::vector<float> xv = x.to(DType::F32).to_vector<float>();
      float amax = 0;
      for (float v : xv) amax = std::max(amax, std::abs(v));
      const float scale = float(double(float8_max(f)) / double(amax));
      EXPECT_EQ(q.scale_inv.to_vector<float>()[0], 1.0f / scale);
      const auto* codes = static_cast<const uint8_t*>(q.codes.data_ptr());
      const auto* codes_t = static_cast<const uint8_t*>(q.codes_t.data_ptr());
      for (int64_t r = 0; r < 37; ++r) {
        for (int64_t c = 0; c < 53; ++c) {
          const uint8_t want = float_to_float8(xv[r * 53 + c] * scale, f);
          ASSERT_EQ(codes[r * 53 + c], want) << r << ", " << c;
          ASSERT_EQ(codes_t[c * 37 + r], want) << r << ", " << c;
        }
      }
      // The largest |x| lands on the format's largest value; values keep their relative error
      // within half a mantissa step (e4m3: 2^-4, e5m2: 2^-3) above the subnormals.
      const Tensor back = float8_dequantize(q.codes, f, q.scale_inv);
      EXPECT_TRUE(all_close(back, x.to(DType::F32), 1e-3 * amax,
                            f == Float8Format::E4M3 ? 0.0625 : 0.125));
    }
  }
}

TEST(Float8Cast, NanAndZeroInputs) {
  const Tensor zeros = runtime::zeros({16, 16});
  const Float8Tensor z = to_float8(zeros, Float8Format::E4M3, true, false);
  EXPECT_TRUE(std::isfinite(z.scale_inv.to_vector<float>()[0]));  // amax clamped to 1e-12
  for (float v : float8_dequantize(z.codes, z.format, z.scale_inv).to_vector<float>()) {
    EXPECT_EQ(v, 0.0f);
  }
  Tensor x = randn_as({4, 4}, DType::F32, 5, "x").contiguous();
  x.data<float>()[5] = std::nanf("");
  const Float8Tensor q = to_float8(x, Float8Format::E4M3, true, false);
  EXPECT_TRUE(std::isnan(q.scale_inv.to_vector<float>()[0]));  // a NaN is not hidden
}

// f64 product of two dequantized operands: a [M, K] @ b [N, K]^T.
std::vector<double> product(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> out(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t t = 0; t < k; ++t) s += av[i * k + t] * bv[j * k + t];
      out[i * n + j] = s;
    }
  }
  return out;
}

Tensor as_tensor(const std::vector<double>& v, const Shape& shape) {
  return from_vector<double>(v, shape, TensorOptions{}.with_dtype(DType::F64));
}

TEST(Float8Matmul, IsTheProductOfTheDecodedValues) {
  const Float8Tensor a = to_float8(randn_as({32, 48}, DType::F32, 1, "a"), Float8Format::E5M2,
                                   true, false);
  const Float8Tensor b = to_float8(randn_as({16, 48}, DType::F32, 2, "b"), Float8Format::E4M3,
                                   true, false);
  for (DType out : {DType::F32, DType::BF16}) {
    const Tensor got = float8_mm(a.codes, a.format, a.scale_inv, b.codes, b.format, b.scale_inv,
                                 out, false);
    EXPECT_EQ(got.dtype(), out);
    const Tensor want = as_tensor(product(float8_dequantize(a.codes, a.format, a.scale_inv),
                                          float8_dequantize(b.codes, b.format, b.scale_inv)),
                                  {32, 16});
    EXPECT_TRUE(all_close(got, want, 1e-5, out == DType::BF16 ? 4e-3 : 1e-5));
  }
  EXPECT_THAT(error_of([&] {
                float8_mm(a.codes, Float8Format::E5M2, a.scale_inv, b.codes, Float8Format::E5M2,
                          b.scale_inv, DType::F32, false);
              }),
              HasSubstr("two e5m2 operands"));
  EXPECT_THAT(error_of([&] {
                float8_mm(a.codes, a.format, a.scale_inv, a.codes_t, b.format, b.scale_inv,
                          DType::F32, false);
              }),
              HasSubstr("expected b as contiguous 2-D codes"));
}

// float8_linear's forward and gradients are the GEMMs of the dequantized FP8 operands: x and W in
// e4m3, the output gradient in e5m2, each with its own tensorwise scale.
TEST(Float8Linear, ForwardAndGradientsAreTheScaledFp8Products) {
  const Tensor x = randn_as({2, 16, 32}, DType::F32, 11, "x").set_requires_grad(true);
  const Tensor w = randn_as({48, 32}, DType::F32, 12, "w").set_requires_grad(true);
  const Tensor bias = randn_as({48}, DType::F32, 13, "b").set_requires_grad(true);
  const Tensor r = randn_as({2, 16, 48}, DType::F32, 14, "r");
  const Tensor y = float8_linear(x, w, bias);
  ASSERT_EQ(y.shape(), (Shape{2, 16, 48}));
  sum(mul(y, r)).backward();

  const auto dq = [](const Tensor& t, Float8Format f) {
    const Float8Tensor q = to_float8(t, f, true, false);
    return float8_dequantize(q.codes, f, q.scale_inv);
  };
  const Tensor xq = dq(x.detach().reshape({32, 32}), Float8Format::E4M3);
  const Tensor wq = dq(w.detach(), Float8Format::E4M3);
  const Tensor gq = dq(r.reshape({32, 48}), Float8Format::E5M2);
  const Tensor y_want = add(as_tensor(product(xq, wq), {32, 48}), bias.detach().to(DType::F64));
  EXPECT_TRUE(all_close(y.reshape({32, 48}), y_want, 1e-5, 1e-5));
  const Tensor dx_want = as_tensor(product(gq, wq.transpose(0, 1).contiguous()), {32, 32});
  EXPECT_TRUE(all_close(x.grad().reshape({32, 32}), dx_want, 1e-5, 1e-5));
  const Tensor dw_want = as_tensor(
      product(gq.transpose(0, 1).contiguous(), xq.transpose(0, 1).contiguous()), {48, 32});
  EXPECT_TRUE(all_close(w.grad(), dw_want, 1e-4, 1e-5));
  EXPECT_TRUE(all_close(bias.grad(), sum(r.reshape({32, 48}), {0}), 1e-5, 1e-5));

  // And near the f32 layer: FP8's few mantissa bits, not a different function.
  const Tensor y32 = linear(x.detach(), w.detach(), bias.detach());
  const double err = std::sqrt(sum(square(sub(y, y32))).item<double>());
  const double norm = std::sqrt(sum(square(y32)).item<double>());
  EXPECT_LT(err / norm, 0.1);
  EXPECT_GT(err, 0.0);  // FP8 ran: the result is not the f32 one
}

// Layers reading one input inside a Float8InputCastSharing scope (attention's q, k, v) cast it
// once, in either recipe: their outputs and every gradient are bit for bit those of separate
// casts, with the input's casts made once instead of three times (tensorwise: one amax pass;
// rowwise: by token and by input feature). An input changed in place since is cast again, and
// casts a layer reduces (tensor parallelism) are never shared.
TEST(Float8Linear, LayersSharingAnInputCastItOnceWithTheSameResults) {
  const Tensor x0 = randn_as({2, 16, 32}, DType::F32, 21, "x");
  std::vector<Tensor> w0, r;
  for (int64_t i = 0; i < 3; ++i) {
    const int64_t out = 16 * (i + 1);
    w0.push_back(randn_as({out, 32}, DType::F32, 22 + uint64_t(i), "w"));
    r.push_back(randn_as({2, 16, out}, DType::F32, 25 + uint64_t(i), "r"));
  }
  struct Run {
    std::vector<Tensor> y, grads;  // the outputs; then dx and each dW
    int64_t casts = 0;             // in the forward: amax passes (tensorwise), casts (rowwise)
  };
  for (const Float8Recipe recipe : {Float8Recipe::Tensorwise, Float8Recipe::Rowwise}) {
    const bool rowwise = recipe == Float8Recipe::Rowwise;
    SCOPED_TRACE(rowwise ? "rowwise" : "tensorwise");
    const auto run = [&](bool share) {
      const Tensor x = x0.clone().set_requires_grad(true);
      std::vector<Tensor> w;
      for (const Tensor& t : w0) w.push_back(t.clone().set_requires_grad(true));
      Run out;
      Profiler::start(Device::cpu());
      {
        std::optional<Float8InputCastSharing> scope;
        if (share) scope.emplace();
        for (const Tensor& wi : w) out.y.push_back(float8_linear(x, wi, Tensor(), recipe));
      }
      for (const ProfiledOp& op : Profiler::stop().ops)
        out.casts += std::string(op.name) == (rowwise ? "float8_rowwise_cast" : "float8_amax");
      Tensor loss = sum(mul(out.y[0], r[0]));
      for (size_t i = 1; i < 3; ++i) loss = add(loss, sum(mul(out.y[i], r[i])));
      loss.backward();
      out.grads.push_back(x.grad());
      for (const Tensor& wi : w) out.grads.push_back(wi.grad());
      return out;
    };
    const Run separate = run(false), shared = run(true);
    // Per layer: tensorwise x and W; rowwise x, x^T, W and W^T. Shared: x's once.
    EXPECT_EQ(separate.casts, rowwise ? 12 : 6);
    EXPECT_EQ(shared.casts, rowwise ? 8 : 4);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(shared.y[i].to_vector<float>(), separate.y[i].to_vector<float>()) << "y" << i;
    for (size_t i = 0; i < 4; ++i)
      EXPECT_EQ(shared.grads[i].to_vector<float>(), separate.grads[i].to_vector<float>()) << i;

    // Changed in place between the calls: cast again, as without the scope.
    const Tensor x = x0.clone();
    Tensor y_changed;
    {
      Float8InputCastSharing scope;
      (void)float8_linear(x, w0[0], Tensor(), recipe);
      mul_(x, 2.0);
      y_changed = float8_linear(x, w0[1], Tensor(), recipe);
    }
    EXPECT_EQ(y_changed.to_vector<float>(),
              float8_linear(mul(x0, 2.0), w0[1], Tensor(), recipe).to_vector<float>());

    // A reduced amax belongs to its layer: every call casts (and reduces) its own (rowwise: a
    // layer split along its input features reduces x's and W's row amaxes).
    int64_t reductions = 0;
    const Float8AmaxReduce count = [&](Tensor&) { ++reductions; };
    {
      Float8InputCastSharing scope;
      (void)float8_linear(x0, w0[0], Tensor(), recipe, count, 1);
      (void)float8_linear(x0, w0[1], Tensor(), recipe, count, 1);
    }
    EXPECT_EQ(reductions, 4);
  }
}

// Rowwise scaling: each row its own scale, max / (its amax), rounded down to a power of two, so
// each row's largest |value| lands in the format's top binade; a zero row keeps finite codes.
TEST(Float8Rowwise, EachRowScaledByItsAmaxRoundedDownToAPowerOfTwo) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (const bool pow2 : {true, false}) {
      Tensor x = randn_as({21, 40}, dtype, 5, "x");
      // Rows of very different magnitudes, and a zero row.
      x = mul(x, from_vector<float>({1e-3f}, {1}).to(dtype));
      x.narrow(0, 3, 1).copy_(mul(x.narrow(0, 3, 1), full({1}, 1e5).to(dtype)));
      x.narrow(0, 7, 1).zero_();
      const Float8Tensor q = to_float8_rowwise(x, Float8Format::E4M3, pow2);
      ASSERT_EQ(q.scale_inv.shape(), (Shape{21}));
      const std::vector<float> xv = x.to(DType::F32).to_vector<float>();
      const std::vector<float> inv = q.scale_inv.to_vector<float>();
      const auto* codes = static_cast<const uint8_t*>(q.codes.data_ptr());
      for (int64_t r = 0; r < 21; ++r) {
        float amax = 0;
        for (int64_t c = 0; c < 40; ++c) amax = std::max(amax, std::abs(xv[size_t(r * 40 + c)]));
        float scale = float8_scale(amax, Float8Format::E4M3);
        if (pow2) {
          scale = std::exp2(std::floor(std::log2(scale)));  // the oracle: floor in f64
          ASSERT_EQ(scale, float8_scale_pow2(float8_scale(amax, Float8Format::E4M3)));
        }
        ASSERT_EQ(inv[size_t(r)], 1.0f / scale) << "row " << r;
        for (int64_t c = 0; c < 40; ++c)
          ASSERT_EQ(codes[r * 40 + c], float_to_float8(xv[size_t(r * 40 + c)] * scale,
                                                       Float8Format::E4M3))
              << r << ", " << c;
        if (amax > 0) {
          EXPECT_GE(amax * scale, pow2 ? 224.0f : 447.9f) << "row " << r;  // top binade
        }
      }
      const Tensor back = float8_dequantize(q.codes, Float8Format::E4M3, q.scale_inv);
      EXPECT_TRUE(all_close(back, x.to(DType::F32), 1e-7, 0.0625));
    }
  }
}

// float8_mm with a scale per row of each operand: out[i][j] = sum * a_scale_inv[i] * b_scale_inv[j].
TEST(Float8Rowwise, MatmulAppliesEachRowsScale) {
  const Float8Tensor a = to_float8_rowwise(randn_as({32, 48}, DType::F32, 1, "a"),
                                           Float8Format::E4M3, true);
  const Float8Tensor b = to_float8_rowwise(randn_as({16, 48}, DType::F32, 2, "b"),
                                           Float8Format::E4M3, true);
  const Float8Tensor bt = to_float8(randn_as({16, 48}, DType::F32, 2, "b"), Float8Format::E4M3,
                                    true, false);  // one rowwise and one tensorwise operand
  for (const Float8Tensor* other : {&b, &bt}) {
    const Tensor got = float8_mm(a.codes, a.format, a.scale_inv, other->codes, other->format,
                                 other->scale_inv, DType::F32, false);
    const Tensor want = as_tensor(
        product(float8_dequantize(a.codes, a.format, a.scale_inv),
                float8_dequantize(other->codes, other->format, other->scale_inv)),
        {32, 16});
    EXPECT_TRUE(all_close(got, want, 1e-5, 1e-5));
  }
  EXPECT_THAT(error_of([&] {
                float8_mm(a.codes, a.format, a.scale_inv.narrow(0, 0, 5), b.codes, b.format,
                          b.scale_inv, DType::F32, false);
              }),
              HasSubstr("32 rows and 5 scales"));
}

// The rowwise float8_linear: every GEMM on operands scaled along its contracted dimension, all
// e4m3 with power-of-two scales: y = x (by token) @ W (by output)^T, dx = dy (by token) @ W^T (by
// input feature)^T, dW = dy^T (by output, over tokens) @ x^T (by input feature, over tokens)^T.
TEST(Float8Linear, RowwiseForwardAndGradientsAreTheAxiswiseScaledProducts) {
  const Tensor x = randn_as({2, 16, 32}, DType::F32, 11, "x").set_requires_grad(true);
  const Tensor w = randn_as({48, 32}, DType::F32, 12, "w").set_requires_grad(true);
  const Tensor r = randn_as({2, 16, 48}, DType::F32, 14, "r");
  const Tensor y = float8_linear(x, w, Tensor(), Float8Recipe::Rowwise);
  ASSERT_EQ(y.shape(), (Shape{2, 16, 48}));
  sum(mul(y, r)).backward();

  // Rows of t [rows, cols] cast rowwise and dequantized.
  const auto dq = [](const Tensor& t) {
    const Float8Tensor q = to_float8_rowwise(t.contiguous(), Float8Format::E4M3, true);
    return float8_dequantize(q.codes, Float8Format::E4M3, q.scale_inv);
  };
  const Tensor x2 = x.detach().reshape({32, 32}), g = r.reshape({32, 48});
  const Tensor y_want = as_tensor(product(dq(x2), dq(w.detach())), {32, 48});
  EXPECT_TRUE(all_close(y.reshape({32, 48}), y_want, 1e-5, 1e-5));
  const Tensor dx_want = as_tensor(product(dq(g), dq(w.detach().transpose(0, 1))), {32, 32});
  EXPECT_TRUE(all_close(x.grad().reshape({32, 32}), dx_want, 1e-5, 1e-5));
  const Tensor dw_want =
      as_tensor(product(dq(g.transpose(0, 1)), dq(x2.transpose(0, 1))), {48, 32});
  EXPECT_TRUE(all_close(w.grad(), dw_want, 1e-4, 1e-5));
  // Closer to the f32 layer than tensorwise scaling on rows of unequal magnitude.
  const Tensor scaled = mul(x.detach(), from_vector<float>({1e-4f, 1.0f}, {2, 1, 1}));
  const Tensor y32 = linear(scaled, w.detach());
  const auto rel_err = [&](Float8Recipe recipe) {
    const Tensor y8 = float8_linear(scaled, w.detach(), Tensor(), recipe);
    return std::sqrt(sum(square(sub(y8.narrow(0, 0, 1), y32.narrow(0, 0, 1)))).item<double>()) /
           std::sqrt(sum(square(y32.narrow(0, 0, 1))).item<double>());
  };
  EXPECT_LT(rel_err(Float8Recipe::Rowwise), 0.1);
  EXPECT_LT(rel_err(Float8Recipe::Rowwise), rel_err(Float8Recipe::Tensorwise));
}

// Tensor parallelism's amax reduction: pieces of a tensor cast with the amax made the whole
// tensor's (here by a reduce that returns the max over both pieces, as an all-reduce would) get
// the whole tensor's scale and codes; a rowwise layer with a reduction is an error.
TEST(Float8Linear, PiecesCastWithTheReducedAmaxGetTheWholeTensorsCodes) {
  const Tensor x = randn_as({16, 64}, DType::F32, 31, "x");
  const Float8Tensor whole = to_float8(x, Float8Format::E4M3, true, false);
  const Tensor left = x.narrow(1, 0, 32).contiguous(), right = x.narrow(1, 32, 32).contiguous();
  const float global = std::max(max(abs(left)).item<float>(), max(abs(right)).item<float>());
  int calls = 0;
  const Float8AmaxReduce reduce = [&](Tensor& amax) {
    ++calls;
    amax.fill_(global);
  };
  const Float8Tensor lq = to_float8(left, Float8Format::E4M3, true, false, reduce);
  const Float8Tensor rq = to_float8(right, Float8Format::E4M3, true, false, reduce);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(lq.scale_inv.item<float>(), whole.scale_inv.item<float>());
  EXPECT_EQ(rq.scale_inv.item<float>(), whole.scale_inv.item<float>());
  const Tensor joined = cat({float8_dequantize(lq.codes, Float8Format::E4M3, lq.scale_inv),
                            float8_dequantize(rq.codes, Float8Format::E4M3, rq.scale_inv)},
                           1);
  EXPECT_TRUE(all_close(joined, float8_dequantize(whole.codes, Float8Format::E4M3,
                                                  whole.scale_inv),
                        0, 0));
  // The layer reduces every cast: x and W forward, the output gradient in backward.
  const Tensor xl = randn_as({16, 32}, DType::F32, 32, "xl").set_requires_grad(true);
  const Tensor w = randn_as({16, 32}, DType::F32, 33, "w").set_requires_grad(true);
  calls = 0;
  const Float8AmaxReduce count = [&](Tensor&) { ++calls; };
  sum(float8_linear(xl, w, Tensor(), Float8Recipe::Tensorwise, count)).backward();
  EXPECT_EQ(calls, 3);
}

// Rowwise under tensor parallelism: pieces of rows (column blocks) cast with the reduced row
// amaxes get each whole row's scale and codes. The layer reduces the operands whose contracted
// dim its split cuts: row-wise (split 1) x and W forward; column-wise (split 0) the output
// gradient and W for dx; never the weight gradient's.
TEST(Float8Rowwise, PiecesOfRowsCastWithReducedAmaxesGetTheWholeRowsCodes) {
  const Tensor x = randn_as({16, 64}, DType::F32, 41, "x");
  const Float8Tensor whole = to_float8_rowwise(x, Float8Format::E4M3, true);
  const Tensor left = x.narrow(1, 0, 32).contiguous(), right = x.narrow(1, 32, 32).contiguous();
  const Tensor row_max = max(abs(x), 1).values.contiguous();  // each whole row's amax
  const Float8AmaxReduce reduce = [&](Tensor& amax) {
    ASSERT_EQ(amax.shape(), (Shape{16}));
    amax.copy_(row_max);
  };
  const Float8Tensor lq = to_float8_rowwise(left, Float8Format::E4M3, true, reduce);
  const Float8Tensor rq = to_float8_rowwise(right, Float8Format::E4M3, true, reduce);
  EXPECT_EQ(lq.scale_inv.to_vector<float>(), whole.scale_inv.to_vector<float>());
  EXPECT_EQ(rq.scale_inv.to_vector<float>(), whole.scale_inv.to_vector<float>());
  // (Codes are joined as values: they never go through the runtime's bool copies.)
  const Tensor joined = cat({float8_dequantize(lq.codes, Float8Format::E4M3, lq.scale_inv),
                            float8_dequantize(rq.codes, Float8Format::E4M3, rq.scale_inv)},
                           1);
  EXPECT_TRUE(all_close(
      joined, float8_dequantize(whole.codes, Float8Format::E4M3, whole.scale_inv), 0, 0));
  // Without the reduction a piece scales by its own half-row: other codes.
  const Float8Tensor own = to_float8_rowwise(left, Float8Format::E4M3, true);
  EXPECT_NE(own.scale_inv.to_vector<float>(), whole.scale_inv.to_vector<float>());

  const Tensor xl = randn_as({16, 32}, DType::F32, 42, "xl");
  const Tensor w = randn_as({16, 32}, DType::F32, 43, "w");
  for (const int64_t split : {0, 1}) {
    SCOPED_TRACE(split);
    int64_t forward = 0, backward = 0, *calls = &forward;
    const Float8AmaxReduce count = [&](Tensor& amax) {
      EXPECT_EQ(amax.dim(), 1);  // a row amax each
      ++*calls;
    };
    const Tensor xs = xl.clone().set_requires_grad(true), ws = w.clone().set_requires_grad(true);
    const Tensor y = float8_linear(xs, ws, Tensor(), Float8Recipe::Rowwise, count, split);
    calls = &backward;
    sum(y).backward();
    // Row-wise: x and W; column-wise: W for dx (cast in the forward) and the output gradient.
    EXPECT_EQ(forward, split == 1 ? 2 : 1);
    EXPECT_EQ(backward, split == 0 ? 1 : 0);
  }
  const Float8AmaxReduce any = [](Tensor&) {};
  EXPECT_THAT(error_of([&] { float8_linear(xl, w, Tensor(), Float8Recipe::Rowwise, any); }),
              HasSubstr("needs the weight's split dim"));
}

// A token count that is not a multiple of 16 is padded with zero rows: the same rows as the
// padded call (zeros change neither the amax nor the other rows), and gradients for x alone.
TEST(Float8Linear, TokensNotAMultipleOf16ArePaddedWithZeroRows) {
  const Tensor x = randn_as({3, 32}, DType::F32, 1, "x").set_requires_grad(true);
  const Tensor w = randn_as({16, 32}, DType::F32, 2, "w").set_requires_grad(true);
  const Tensor y = float8_linear(x, w);
  ASSERT_EQ(y.shape(), (Shape{3, 16}));
  const Tensor padded = cat({x.detach(), zeros({13, 32})}, 0);
  EXPECT_TRUE(all_close(y, float8_linear(padded, w.detach()).narrow(0, 0, 3), 0, 0));
  EXPECT_FALSE(all_close(y, linear(x.detach(), w.detach()), 0, 0));  // FP8, not f32
  sum(y).backward();
  EXPECT_EQ(x.grad().shape(), x.shape());
  EXPECT_EQ(w.grad().shape(), w.shape());
}

TEST(Float8Linear, RejectsWhatFp8GemmsCannotRun) {
  EXPECT_THAT(*float8_linear_unsupported(Device::cpu(), 30, 48), HasSubstr("not a multiple of 16"));
  EXPECT_FALSE(float8_linear_unsupported(Device::cpu(), 32, 48).has_value());
  const Tensor x = randn_as({16, 30}, DType::F32, 1, "x");
  EXPECT_THAT(error_of([&] { float8_linear(x, randn_as({48, 30}, DType::F32, 2, "w")); }),
              HasSubstr("in 30 x out 48 is not a multiple of 16"));
  EXPECT_THAT(error_of([&] { float8_linear(x, randn_as({48, 30}, DType::F64, 2, "w")); }),
              HasSubstr("expected an f32 or bf16 input and weight of one dtype"));
  EXPECT_THAT(error_of([&] { to_float8(randn_as({2, 2, 2}, DType::F32, 1, "x"),
                                       Float8Format::E4M3, true, false); }),
              HasSubstr("expected a 2-D tensor"));
}

TEST(Float8Codes, TransposeMovesEveryByte) {
  const Float8Tensor q = to_float8(randn_as({48, 80}, DType::F32, 4, "x"), Float8Format::E4M3,
                                   true, true);
  const Tensor t = float8_transpose(q.codes);
  ASSERT_EQ(t.shape(), (Shape{80, 48}));
  EXPECT_EQ(std::memcmp(t.data_ptr(), q.codes_t.data_ptr(), 80 * 48), 0);
  int high_bits = 0;  // codes other than 0 and 1: a bool copy would have lost them
  const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel(); ++i) high_bits += bytes[i] > 1;
  EXPECT_GT(high_bits, 48 * 80 / 2);
}

// Registered codes (FSDP's float8 all-gather) stand for the weight: its own values are not read.
TEST(Float8Codes, RegisteredWeightCodesReplaceTheCast) {
  const Tensor x = randn_as({16, 32}, DType::F32, 1, "x").set_requires_grad(true);
  const Tensor w = randn_as({48, 32}, DType::F32, 2, "w");
  const Tensor want = float8_linear(x, w);
  const Tensor stand_in = zeros({48, 32}).set_requires_grad(true);  // values never read
  register_float8_weight_codes(stand_in, to_float8(w, Float8Format::E4M3, true, false));
  const Tensor got = float8_linear(x, stand_in);
  EXPECT_TRUE(all_close(got, want, 0, 0));
  sum(got).backward();  // backward transposes the registered codes
  EXPECT_EQ(stand_in.grad().shape(), w.shape());
  x.set_grad(Tensor());
  sum(float8_linear(x, w)).backward();
  const Tensor dx_want = x.grad();
  x.set_grad(Tensor());
  sum(float8_linear(x, stand_in)).backward();
  EXPECT_TRUE(all_close(x.grad(), dx_want, 0, 0));
  unregister_float8_weight_codes(stand_in);
  EXPECT_FALSE(all_close(float8_linear(x, stand_in), want, 0, 0));  // zeros again
}

class Tiny : public nn::Module {
 public:
  Tiny() : Module("Tiny") {
    wq = register_module("wq", std::make_shared<nn::Linear>(32, 48, false));
    odd = register_module("odd", std::make_shared<nn::Linear>(30, 48, false));
    output = register_module("output", std::make_shared<nn::Linear>(48, 64, false));
  }
  std::shared_ptr<nn::Linear> wq, odd, output;
};

TEST(Float8Conversion, ConvertsLinearsExceptFilteredAndUnsupportedOnes) {
  Tiny model;
  const nn::Float8Conversion c = nn::convert_linears_to_float8(model, Device::cpu(), {"output"});
  EXPECT_EQ(c.converted, std::vector<std::string>{"wq"});
  ASSERT_EQ(c.skipped.size(), 2u);
  EXPECT_EQ(c.skipped[0].first, "odd");
  EXPECT_THAT(c.skipped[0].second, HasSubstr("not a multiple of 16"));
  EXPECT_EQ(c.skipped[1], (std::pair<std::string, std::string>{"output", "filtered"}));
  EXPECT_TRUE(model.wq->float8);
  EXPECT_FALSE(model.odd->float8);
  EXPECT_FALSE(model.output->float8);
  // The converted layer's output is float8_linear's.
  const Tensor x = randn_as({16, 32}, DType::F32, 1, "x");
  EXPECT_TRUE(all_close((*model.wq)(x), float8_linear(x, model.wq->weight), 0, 0));
}

}  // namespace
}  // namespace mt::runtime
