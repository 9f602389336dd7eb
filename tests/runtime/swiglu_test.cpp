// swiglu: forward against silu(gate) * up written out, gradcheck (contiguous and strided), the
// gradient formulas for each input alone, 16-bit precision, the vectorised f32 path, errors.
#include "runtime/ops/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <utility>

#include "runtime/autograd/gradcheck.h"
#include "runtime/ops/factory.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::randn64;
using testing::randn_as;

Tensor naive_swiglu(const Tensor& gate, const Tensor& up) {
  const auto g = gate.to_vector<double>(), u = up.to_vector<double>();
  std::vector<double> out(g.size());
  for (size_t i = 0; i < g.size(); ++i) out[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return from_vector<double>(out, gate.shape(), TensorOptions{}.with_dtype(DType::F64));
}

TEST(Swiglu, ForwardMatchesNaive) {
  Tensor g = randn64({3, 7}, 1, false), u = randn64({3, 7}, 2, false);
  EXPECT_TRUE(all_close(swiglu(g, u), naive_swiglu(g, u), 1e-14, 1e-13));
  Tensor g32 = randn_as({1000}, DType::F32, 3), u32 = randn_as({1000}, DType::F32, 4);
  EXPECT_TRUE(all_close(swiglu(g32, u32), naive_swiglu(g32, u32), 1e-6, 1e-5));
  Tensor gb = g32.to(DType::BF16), ub = u32.to(DType::BF16);
  Tensor yb = swiglu(gb, ub);
  EXPECT_EQ(yb.dtype(), DType::BF16);
  EXPECT_TRUE(all_close(yb, naive_swiglu(gb, ub), 1e-3, 8e-3));
}

TEST(Swiglu, LargeNegativeGateIsZeroNotNan) {
  Tensor g = from_vector<double>({-1000.0, 1000.0}, {2}, TensorOptions{}.with_dtype(DType::F32));
  Tensor u = ones({2});
  const auto y = swiglu(g, u).to_vector<double>();
  EXPECT_EQ(y[0], 0.0);  // -1000 * sigmoid(-1000) underflows to -0
  EXPECT_EQ(y[1], 1000.0);
}

TEST(Swiglu, GradcheckContiguousAndStrided) {
  Tensor g = randn64({4, 5}, 5), u = randn64({4, 5}, 6);
  auto r = autograd::gradcheck([](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); },
                               {g, u});
  EXPECT_TRUE(r.ok) << r.message;
  Tensor gs = randn64({5, 4}, 7, false).t().set_requires_grad(true);
  Tensor us = randn64({4, 10}, 8, false).slice(1, 0, 10, 2).set_requires_grad(true);
  ASSERT_FALSE(gs.is_contiguous());
  ASSERT_FALSE(us.is_contiguous());
  auto r2 = autograd::gradcheck([](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); },
                                {gs, us});
  EXPECT_TRUE(r2.ok) << r2.message;
}

TEST(Swiglu, GradientFormulas) {
  Tensor g = randn64({6}, 9), u = randn64({6}, 10);
  swiglu(g, u).backward(ones({6}, TensorOptions{}.with_dtype(DType::F64)));
  const auto gv = g.to_vector<double>(), uv = u.to_vector<double>();
  const auto dg = g.grad().to_vector<double>(), du = u.grad().to_vector<double>();
  for (size_t i = 0; i < gv.size(); ++i) {
    const double s = 1.0 / (1.0 + std::exp(-gv[i]));
    EXPECT_NEAR(du[i], gv[i] * s, 1e-14);
    EXPECT_NEAR(dg[i], uv[i] * (s + gv[i] * s * (1 - s)), 1e-14);
  }
  Tensor u2 = randn64({6}, 11, false);
  auto r = autograd::gradcheck([&](const std::vector<Tensor>& in) { return swiglu(in[0], u2); },
                               {randn64({6}, 12)});
  EXPECT_TRUE(r.ok) << r.message;
}

// f32 runs through vectorised rows (vec_math.h): its forward and each of its three backward paths
// (both gradients, the gate's alone, up's alone) against the f64 kernel, on a length that leaves
// a remainder after any vector width, with large gates of both signs among the values.
// Gate values spread over [-16, 16] plus the extremes (exp's clamps, 0) at its ends.
Tensor spread_gate(int64_t n, uint64_t seed) {
  std::vector<float> gv = randn_as({n}, DType::F32, seed).to_vector<float>();
  for (float& x : gv) x *= 4.0f;
  gv[0] = -200.0f, gv[1] = 200.0f, gv[2] = 0.0f, gv[size_t(n - 1)] = -90.0f;
  return from_vector<float>(gv, {n});
}

// swiglu and its gradients (each input alone and both) in g's dtype against f64 on the same
// inputs, each pair compared by `check(got, want)`.
void expect_matches_f64(const Tensor& g, const Tensor& u, const Tensor& dy,
                        const std::function<void(const Tensor&, const Tensor&)>& check) {
  check(swiglu(g, u), swiglu(g.to(DType::F64), u.to(DType::F64)));
  for (auto [need_g, need_u] : {std::pair{true, true}, {true, false}, {false, true}}) {
    SCOPED_TRACE(::testing::Message() << "gate " << need_g << ", up " << need_u);
    Tensor grads[2][2];
    for (DType dt : {g.dtype(), DType::F64}) {
      Tensor gl = g.to(dt).clone().set_requires_grad(need_g),
             ul = u.to(dt).clone().set_requires_grad(need_u);
      swiglu(gl, ul).backward(dy.to(dt));
      grads[dt == DType::F64][0] = gl.grad();
      grads[dt == DType::F64][1] = ul.grad();
    }
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(grads[0][i].defined(), i == 0 ? need_g : need_u);
      SCOPED_TRACE(i ? "up" : "gate");
      if (grads[0][i].defined()) check(grads[0][i], grads[1][i]);
    }
  }
}

TEST(Swiglu, F32VectorisedPathMatchesF64) {
  const Tensor g = spread_gate(1001, 13), u = randn_as({1001}, DType::F32, 14);
  const Tensor dy = randn_as({1001}, DType::F32, 15);
  expect_matches_f64(g, u, dy, [](const Tensor& got, const Tensor& want) {
    EXPECT_TRUE(all_close(got, want, 1e-6, 1e-5));
  });
}

// bf16 through the f32 rows in chunks (1300 elements: past a chunk, a ragged tail): each output
// within one bf16 rounding of the f64 result on the same bf16 inputs (plus exp_f32's 2 ulp).
TEST(Swiglu, Bf16ChunkedPathMatchesF64) {
  const Tensor g = spread_gate(1300, 16).to(DType::BF16);
  const Tensor u = randn_as({1300}, DType::BF16, 17), dy = randn_as({1300}, DType::BF16, 18);
  expect_matches_f64(g, u, dy, [](const Tensor& got, const Tensor& want) {
    EXPECT_EQ(got.dtype(), DType::BF16);
    const std::vector<double> a = got.to_vector<double>(), b = want.to_vector<double>();
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_LE(std::abs(a[i] - b[i]), std::ldexp(std::abs(b[i]), -8) * 1.01 + 1e-30) << i;
  });
}

TEST(Swiglu, Errors) {
  try {
    swiglu(randn64({2, 3}, 1, false), randn64({3, 2}, 2, false));
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("swiglu"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3, 2]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(swiglu(randn64({3}, 1, false), randn64({3}, 2, false).to(DType::F32)), Error);
  EXPECT_THROW(swiglu(randn64({3}, 1, false), randn64({1}, 2, false)), Error);  // no broadcast
  EXPECT_THROW(swiglu(arange(3), arange(3)), Error);                            // integer
}

}  // namespace
}  // namespace mt::runtime
