// dropout: the mask is uniform_at(key, i) < p in row-major order (any layout, any thread count),
// kept values scale by 1 / (1 - p), backward applies the same mask, identity cases, errors.
#include "runtime/ops/dropout.h"

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

// Expected output: x[i] / (1 - p) or 0, with i the row-major index of the logical tensor.
std::vector<double> naive_dropout(const Tensor& x, double p, const RandomKey& key) {
  auto v = x.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = uniform_at(key, i) < p ? 0.0 : v[i] / (1.0 - p);
  return v;
}

TEST(Dropout, MaskFollowsCounterRng) {
  const RandomKey key(7, "layers.0.dropout", 3);
  Tensor x = randn64({9, 11}, 1, false);
  const auto y = dropout(x, 0.3, key).to_vector<double>();
  const auto expected = naive_dropout(x, 0.3, key);
  ASSERT_EQ(y.size(), expected.size());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-15) << i;
}

TEST(Dropout, StridedInputUsesLogicalRowMajorIndex) {
  const RandomKey key(8, "dropout");
  Tensor x = randn64({6, 5}, 2, false).t();  // [5, 6], non-contiguous
  ASSERT_FALSE(x.is_contiguous());
  const auto y = dropout(x, 0.5, key).to_vector<double>();
  const auto expected = naive_dropout(x, 0.5, key);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-15) << i;
}

TEST(Dropout, DropFractionAndDifferentKeys) {
  Tensor x = ones({200000});
  const RandomKey key(9, "dropout");
  const auto y = dropout(x, 0.25, key).to_vector<double>();
  size_t dropped = 0;
  for (double v : y) {
    if (v == 0.0) {
      ++dropped;
    } else {
      EXPECT_FLOAT_EQ(v, 1.0 / 0.75);
    }
  }
  EXPECT_NEAR(double(dropped) / double(y.size()), 0.25, 0.005);  // ~5 sigma
  // Another offset draws another mask; the same key the same mask.
  EXPECT_FALSE(all_close(dropout(x, 0.25, key.with_offset(1)), dropout(x, 0.25, key), 0, 0));
  EXPECT_TRUE(all_close(dropout(x, 0.25, key), dropout(x, 0.25, key), 0, 0));
}

TEST(Dropout, BitIdenticalAcrossThreadCounts) {
  const Tensor x = randn_as({300, 1000}, DType::F32, 3);
  const RandomKey key(10, "dropout");
  const int saved = omp_get_max_threads();
  std::vector<std::vector<uint32_t>> bits;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    const Tensor y = dropout(x, 0.1, key);
    bits.emplace_back(size_t(y.numel()));
    std::memcpy(bits.back().data(), y.data<float>(), bits.back().size() * 4);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(bits[0], bits[1]);
}

TEST(Dropout, IdentityWhenNotTrainingOrPZero) {
  Tensor x = randn64({4, 4}, 4, false);
  EXPECT_TRUE(dropout(x, 0.5, RandomKey(1, "d"), /*training=*/false).same(x));
  EXPECT_TRUE(dropout(x, 0.0, RandomKey(1, "d")).same(x));
}

TEST(Dropout, BackwardUsesTheSameMask) {
  const RandomKey key(11, "dropout");
  Tensor x = randn64({7, 8}, 5);
  Tensor y = dropout(x, 0.4, key);
  const Tensor dy = randn64({7, 8}, 6, false);
  y.backward(dy);
  const auto dx = x.grad().to_vector<double>(), expected = naive_dropout(dy, 0.4, key);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx[i], expected[i], 1e-15) << i;
  auto r =
      autograd::gradcheck([&](const std::vector<Tensor>& in) { return dropout(in[0], 0.4, key); },
                          {randn64({6, 4}, 7, false).t().set_requires_grad(true)});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Dropout, Bf16ComputesInF32) {
  const RandomKey key(12, "dropout");
  Tensor x = randn_as({64}, DType::BF16, 8);
  Tensor y = dropout(x, 0.5, key);
  EXPECT_EQ(y.dtype(), DType::BF16);
  const auto yv = y.to_vector<double>(), expected = naive_dropout(x, 0.5, key);
  for (size_t i = 0; i < yv.size(); ++i) EXPECT_EQ(yv[i], expected[i]) << i;  // x2 is exact
}

TEST(Dropout, Errors) {
  Tensor x = randn64({3}, 1, false);
  try {
    dropout(x, 1.0, RandomKey(1, "d"));
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dropout: expected p in [0, 1), got 1"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(dropout(x, -0.1, RandomKey(1, "d")), Error);
  EXPECT_THROW(dropout(x, std::nan(""), RandomKey(1, "d")), Error);
  EXPECT_THROW(dropout(arange(3), 0.5, RandomKey(1, "d")), Error);
}

}  // namespace
}  // namespace mt::runtime
