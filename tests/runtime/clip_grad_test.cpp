// Gradient clipping by global norm: the total norm against hand computation (p = 2, 1, 3, inf),
// scaling by max_norm / (total + 1e-6) only when over, parameters without grad skipped, mixed
// dtypes and non-contiguous grads, the split local_norm_pow + combine + root (the FSDP path),
// non-finite totals, the device-resident (tensor) path against the host path, and bad arguments.
#include "runtime/optim/clip_grad.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime::optim {
namespace {

using ::testing::HasSubstr;

Tensor param_with_grad(const std::vector<double>& grad, DType dtype = DType::F64,
                       Shape shape = {}) {
  if (shape.empty()) shape = {int64_t(grad.size())};
  Tensor p = zeros(shape, TensorOptions{}.with_dtype(dtype));
  p.set_requires_grad(true);
  p.set_grad(from_vector<double>(grad, shape, TensorOptions{}.with_dtype(dtype)));
  return p;
}

std::vector<double> grad_of(const Tensor& p) { return p.grad().to_vector<double>(); }

TEST(ClipGrad, TotalNormMatchesHandComputation) {
  const Tensor a = param_with_grad({3.0, -4.0});
  const Tensor b = param_with_grad({1.0, 2.0, -2.0, 0.5}, DType::F64, {2, 2});
  const std::vector<Tensor> params{a, b};
  // p = 2: sqrt(9 + 16 + 1 + 4 + 4 + 0.25)
  EXPECT_DOUBLE_EQ(total_grad_norm(params), std::sqrt(34.25));
  // p = 1: 3 + 4 + 1 + 2 + 2 + 0.5
  EXPECT_DOUBLE_EQ(total_grad_norm(params, 1.0), 12.5);
  // p = 3
  const double s3 = 27 + 64 + 1 + 8 + 8 + 0.125;
  EXPECT_NEAR(total_grad_norm(params, 3.0), std::cbrt(s3), 1e-12);
  // p = inf: the largest magnitude
  EXPECT_DOUBLE_EQ(total_grad_norm(params, std::numeric_limits<double>::infinity()), 4.0);
  // Not clipped: grads unchanged.
  EXPECT_EQ(grad_of(a), (std::vector<double>{3.0, -4.0}));
}

TEST(ClipGrad, ScalesWhenOverMaxNorm) {
  const Tensor a = param_with_grad({3.0, -4.0});
  const Tensor b = param_with_grad({12.0});
  const double total = clip_grad_norm_({a, b}, 1.0);
  EXPECT_DOUBLE_EQ(total, 13.0);  // returns the norm before clipping
  const double coef = 1.0 / (13.0 + 1e-6);
  const std::vector<double> ga = grad_of(a), gb = grad_of(b);
  EXPECT_DOUBLE_EQ(ga[0], 3.0 * coef);
  EXPECT_DOUBLE_EQ(ga[1], -4.0 * coef);
  EXPECT_DOUBLE_EQ(gb[0], 12.0 * coef);
  EXPECT_NEAR(total_grad_norm({a, b}), 1.0, 1e-6);
}

TEST(ClipGrad, InfNormClips) {
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor a = param_with_grad({0.5, -8.0, 2.0});
  const double total = clip_grad_norm_({a}, 2.0, inf);
  EXPECT_DOUBLE_EQ(total, 8.0);
  const double coef = 2.0 / (8.0 + 1e-6);
  const std::vector<double> g = grad_of(a);
  EXPECT_DOUBLE_EQ(g[0], 0.5 * coef);
  EXPECT_DOUBLE_EQ(g[1], -8.0 * coef);
  EXPECT_NEAR(total_grad_norm({a}, inf), 2.0, 1e-6);
}

TEST(ClipGrad, NoClipWhenUnderOrEqual) {
  const Tensor a = param_with_grad({0.3, 0.4});  // norm 0.5
  EXPECT_DOUBLE_EQ(clip_grad_norm_({a}, 1.0), 0.5);
  EXPECT_EQ(grad_of(a), (std::vector<double>{0.3, 0.4}));
  const Tensor b = param_with_grad({3.0, 4.0});  // norm exactly max_norm
  EXPECT_DOUBLE_EQ(clip_grad_norm_({b}, 5.0), 5.0);
  EXPECT_EQ(grad_of(b), (std::vector<double>{3.0, 4.0}));
  EXPECT_DOUBLE_EQ(clip_grads_with_norm_({b}, 5.0, 5.0), 1.0);
}

TEST(ClipGrad, ParamsWithoutGradAreSkipped) {
  const Tensor with = param_with_grad({6.0, 8.0});
  Tensor without = ones({3}, TensorOptions{}.with_dtype(DType::F64));
  without.set_requires_grad(true);  // no grad yet
  const Tensor frozen = ones({2});  // no autograd at all
  const std::vector<Tensor> params{without, with, frozen, Tensor()};
  EXPECT_DOUBLE_EQ(clip_grad_norm_(params, 5.0), 10.0);
  EXPECT_FALSE(without.grad().defined());
  EXPECT_FALSE(frozen.grad().defined());
  EXPECT_NEAR(grad_of(with)[0], 3.0, 1e-6);
  // Nothing has a grad: the norm is 0 and nothing happens.
  EXPECT_DOUBLE_EQ(clip_grad_norm_({without, frozen}, 1.0), 0.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm_({}, 1.0), 0.0);
}

TEST(ClipGrad, MixedDtypesAndNonContiguousGrads) {
  // f32 and bf16 grads are summed in f64; a transposed (non-contiguous) grad is scaled in place.
  const Tensor a = param_with_grad({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, DType::F32, {2, 3});
  const Tensor b = param_with_grad({0.5, -1.5}, DType::BF16);  // exact in bf16
  Tensor c = zeros({3, 2}, TensorOptions{}.with_dtype(DType::F64));
  c.set_requires_grad(true);
  const Tensor g =
      from_vector<double>({1, -1, 2, -2, 3, -3}, {2, 3}, TensorOptions{}.with_dtype(DType::F64));
  c.set_grad(g.t());
  ASSERT_FALSE(c.grad().is_contiguous());
  const double expected = std::sqrt(91.0 + 0.25 + 2.25 + 28.0);
  const double total = clip_grad_norm_({a, b, c}, 1.0);
  EXPECT_NEAR(total, expected, 1e-12);
  const double coef = 1.0 / (expected + 1e-6);
  EXPECT_NEAR(grad_of(a)[5], 6.0 * coef, 1e-6);                      // f32 rounding
  EXPECT_NEAR(grad_of(b)[1], -1.5 * coef, 1.5 * coef * 1e-2);        // bf16 rounding
  EXPECT_NEAR(c.grad().to_vector<double>()[1], -2.0 * coef, 1e-12);  // c.grad()[0][1] = g[1][0]
  EXPECT_NEAR(g.to_vector<double>()[3], -2.0 * coef, 1e-12);  // scaled in place, through the view
  EXPECT_EQ(a.grad().dtype(), DType::F32);
  EXPECT_EQ(b.grad().dtype(), DType::BF16);
  EXPECT_NEAR(total_grad_norm({a, b, c}), 1.0, 1e-2);
}

TEST(ClipGrad, LocalPowCombineRootEqualsWholeNorm) {
  // Two "shards" (as FSDP ranks or meshes would hold): partial sums combine to the full norm.
  const Tensor a = param_with_grad({1.0, -2.0, 3.0});
  const Tensor b = param_with_grad({-4.0, 5.0});
  for (double p : {1.0, 2.0, 3.0, std::numeric_limits<double>::infinity()}) {
    const std::array<double, 2> partials{local_norm_pow({a}, p), local_norm_pow({b}, p)};
    EXPECT_NEAR(norm_from_pow(combine_norm_pows(partials, p), p), total_grad_norm({a, b}, p), 1e-12)
        << "p = " << p;
  }
  EXPECT_DOUBLE_EQ(local_norm_pow({a, b}), 55.0);
  EXPECT_DOUBLE_EQ(local_norm_pow({a, b}, std::numeric_limits<double>::infinity()), 5.0);
  const std::array<double, 2> with_nan{1.0, std::nan("")};
  EXPECT_TRUE(std::isnan(combine_norm_pows(with_nan, std::numeric_limits<double>::infinity())));
}

TEST(ClipGrad, NonFiniteTotal) {
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor a = param_with_grad({1.0, std::nan("")});
  const Tensor b = param_with_grad({inf, 1.0});
  try {
    clip_grad_norm_({a}, 1.0, 2.0, /*error_if_nonfinite=*/true);
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("clip_grad_norm_"));
    EXPECT_THAT(e.what(), HasSubstr("non-finite"));
  }
  EXPECT_THROW(clip_grad_norm_({b}, 1.0, 2.0, true), Error);
  EXPECT_THROW(clip_grad_norm_({b}, 1.0, inf, true), Error);
  // The grads are untouched by a failed call.
  EXPECT_EQ(grad_of(b)[0], inf);
  EXPECT_EQ(grad_of(b)[1], 1.0);
  // Without the check the norm is returned; a NaN norm never scales.
  EXPECT_TRUE(std::isnan(clip_grad_norm_({a}, 1.0)));
  EXPECT_EQ(grad_of(a)[0], 1.0);
  EXPECT_EQ(clip_grad_norm_({b}, 1.0), inf);
}

// The device-resident path (norm and coefficient as tensors, for CUDA steps without host syncs)
// scales exactly as the host path: f32, bf16 and strided f64 grads; over, under and at max_norm;
// NaN and infinite totals; p = 2 and inf.
TEST(ClipGrad, TensorPathEqualsHostPathBitwise) {
  const double inf = std::numeric_limits<double>::infinity();
  auto make = [](double scale, double special) {
    std::vector<Tensor> ps{param_with_grad({1.1 * scale, -2.3 * scale, 0.7 * scale}, DType::F32),
                           param_with_grad({0.5 * scale, special}, DType::BF16)};
    Tensor c = zeros({3, 2}, TensorOptions{}.with_dtype(DType::F64));
    c.set_requires_grad(true);
    c.set_grad(from_vector<double>({1, -1, 2, -2, 3, -3}, {2, 3},
                                   TensorOptions{}.with_dtype(DType::F64))
                   .t());
    ps.push_back(c);
    return ps;
  };
  for (double p : {2.0, inf}) {
    for (double scale : {0.01, 1.0, 37.0}) {
      for (double special : {0.25, std::nan(""), inf}) {
        SCOPED_TRACE(::testing::Message() << "p " << p << " scale " << scale << " " << special);
        const std::vector<Tensor> host = make(scale, special), dev = make(scale, special);
        const double total = total_grad_norm(host, p);
        const Tensor total_t = norm_from_pow(local_norm_pow_tensor(dev, p), p);
        if (std::isnan(total)) {
          EXPECT_TRUE(std::isnan(total_t.item<double>()));
        } else {
          EXPECT_EQ(total_t.item<double>(), total);
        }
        clip_grads_with_norm_(host, 2.5, total);
        clip_grads_with_norm_(dev, 2.5, total_t);
        for (size_t i = 0; i < host.size(); ++i) {
          const std::vector<double> a = grad_of(host[i]), b = grad_of(dev[i]);
          ASSERT_EQ(a.size(), b.size());
          for (size_t j = 0; j < a.size(); ++j) {
            if (std::isnan(a[j])) {
              EXPECT_TRUE(std::isnan(b[j])) << "param " << i << " element " << j;
            } else {
              EXPECT_EQ(a[j], b[j]) << "param " << i << " element " << j;
            }
          }
        }
      }
    }
  }
  // The norm exactly at max_norm does not scale either way.
  const std::vector<Tensor> at = {param_with_grad({3.0, 4.0})};
  clip_grads_with_norm_(at, 5.0, norm_from_pow(local_norm_pow_tensor(at)));
  EXPECT_EQ(grad_of(at[0]), (std::vector<double>{3.0, 4.0}));
  EXPECT_EQ(local_norm_pow_tensor({}).item<double>(), 0.0);
}

TEST(ClipGrad, BadArguments) {
  const Tensor a = param_with_grad({1.0});
  EXPECT_THROW(clip_grad_norm_({a}, -1.0), Error);
  EXPECT_THROW(clip_grad_norm_({a}, std::nan("")), Error);
  try {
    total_grad_norm({a}, 0.0);
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("norm_type must be > 0 or +inf, got 0"));
  }
  EXPECT_THROW(total_grad_norm({a}, -std::numeric_limits<double>::infinity()), Error);
}

TEST(ClipGrad, LeavesGradModeAsItWas) {
  const Tensor a = param_with_grad({30.0, 40.0});
  ASSERT_TRUE(GradMode::enabled());
  clip_grad_norm_({a}, 1.0);
  EXPECT_TRUE(GradMode::enabled());
  EXPECT_EQ(a.grad().grad_fn(), nullptr);
}

}  // namespace
}  // namespace mt::runtime::optim
