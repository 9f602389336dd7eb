// Tests of runtime/ops/join.h: cat, stack, split, chunk (values, views, gradcheck, errors).
#include "runtime/ops/join.h"

#include <gtest/gtest.h>

#include "runtime/autograd/gradcheck.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using mt::testing::all_close;
using mt::testing::randn64;
using mt::testing::ravel;
using mt::testing::unravel;
using Coords = std::vector<int64_t>;

// Reference cat: each output element looked up in the input that covers its coordinate.
Tensor ref_cat(const std::vector<Tensor>& ts, int64_t dim) {
  Shape shape = ts[0].shape();
  shape[size_t(dim)] = 0;
  for (const Tensor& t : ts) shape[size_t(dim)] += t.size(dim);
  std::vector<std::vector<double>> vals;
  for (const Tensor& t : ts) vals.push_back(t.to_vector<double>());
  std::vector<double> out(size_t(numel_of(shape)));
  for (int64_t f = 0; f < int64_t(out.size()); ++f) {
    Coords c = unravel(f, shape);
    size_t i = 0;
    while (c[size_t(dim)] >= ts[i].size(dim)) c[size_t(dim)] -= ts[i++].size(dim);
    out[size_t(f)] = vals[i][size_t(ravel(c, ts[i].shape()))];
  }
  return from_vector<double>(out, shape, TensorOptions{}.with_dtype(DType::F64));
}

using mt::testing::error_of;

TEST(Cat, MatchesReferenceEveryDim) {
  for (int64_t dim : {0, 1, 2, -1}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    std::vector<Tensor> ts;
    for (int64_t i = 0; i < 3; ++i) {
      Shape s = {2, 3, 4};
      s[size_t(d)] = i + 1;
      ts.push_back(randn64(s, uint64_t(10 * d + i), false));
    }
    ts[1] = ts[1].transpose(0, 2).contiguous().transpose(0, 2);  // strided input
    EXPECT_TRUE(all_close(cat(ts, dim), ref_cat(ts, d), 0, 0)) << "dim " << dim;
  }
}

TEST(Cat, SingleTensorEmptyPartAndIntegers) {
  const Tensor a = randn64({2, 3}, 1, false);
  EXPECT_TRUE(all_close(cat({a}, 1), a, 0, 0));
  const Tensor out = cat({a, zeros({0, 3}, a.options()), a}, 0);
  EXPECT_EQ(out.shape(), (Shape{4, 3}));
  EXPECT_TRUE(all_close(out.narrow(0, 2, 2), a, 0, 0));
  const auto opts = TensorOptions{}.with_dtype(DType::I64);
  const Tensor i = cat(
      {from_vector<int64_t>({1, 2}, {1, 2}, opts), from_vector<int64_t>({3, 4}, {1, 2}, opts)}, 1);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(Cat, Gradcheck) {
  const Tensor a = randn64({2, 3}, 2);
  const Tensor b = randn64({3, 2}, 3, false).t().set_requires_grad(true);  // [2, 3]
  const Tensor c = randn64({2, 1}, 4);
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return cat({in[0], in[1], in[2]}, 1);
      },
      {a, b, c});
  EXPECT_TRUE(r.ok) << r.message;
  r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return cat({in[0], in[1]}, 0);
      },
      {a, b});
  EXPECT_TRUE(r.ok) << r.message;
  // Only some inputs require grad.
  const Tensor frozen = randn64({2, 3}, 5, false);
  r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return cat({frozen, in[0]}, 0);
      },
      {a});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Cat, MismatchesThrowNamingPositionAndShapes) {
  const Tensor a = randn64({2, 3}, 6, false);
  const std::string msg = error_of([&] { cat({a, a, randn64({2, 4}, 7, false)}, 0); });
  EXPECT_NE(msg.find("cat: tensor 2 has shape [2, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 0 has shape [2, 3]"), std::string::npos) << msg;
  const std::string dt = error_of([&] { cat({a, a.to(DType::F32)}, 0); });
  EXPECT_NE(dt.find("cat: tensor 1 has dtype f32"), std::string::npos) << dt;
  EXPECT_THROW(cat({}, 0), mt::Error);
  EXPECT_THROW(cat({a, randn64({2}, 8, false)}, 0), mt::Error);  // ndim
  EXPECT_THROW(cat({scalar_tensor(1.0)}, 0), mt::Error);
  EXPECT_THROW(cat({a}, 2), mt::Error);
}

TEST(Stack, MatchesReference) {
  const Tensor a = randn64({2, 3}, 9, false);
  const Tensor b = randn64({3, 2}, 10, false).t();
  for (int64_t dim : {0, 1, 2, -1}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    const Tensor out = stack({a, b}, dim);
    Shape expect = {2, 3};
    expect.insert(expect.begin() + d, 2);
    ASSERT_EQ(out.shape(), expect);
    EXPECT_TRUE(all_close(out.select(d, 0), a, 0, 0)) << "dim " << dim;
    EXPECT_TRUE(all_close(out.select(d, 1), b, 0, 0)) << "dim " << dim;
  }
}

TEST(Stack, GradcheckAndErrors) {
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return stack({in[0], in[1]}, 1);
      },
      {randn64({2, 3}, 11), randn64({2, 3}, 12)});
  EXPECT_TRUE(r.ok) << r.message;
  const Tensor a = randn64({2, 3}, 13, false);
  const std::string msg = error_of([&] { stack({a, a.t()}, 0); });
  EXPECT_NE(msg.find("stack: tensor 1 has shape [3, 2]"), std::string::npos) << msg;
  EXPECT_THROW(stack({a}, 3), mt::Error);
  const std::string dt = error_of([&] { stack({a, a.to(DType::F32)}, 0); });
  EXPECT_NE(dt.find("stack: tensor 1 has dtype f32"), std::string::npos) << dt;
}

TEST(Split, BySizeAndBySizesAreViews) {
  const Tensor x = randn64({7, 2}, 14, false);
  const auto parts = split(x, 3, 0);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].shape(), (Shape{1, 2}));
  for (const Tensor& p : parts) EXPECT_TRUE(p.shares_storage_with(x));
  EXPECT_TRUE(all_close(parts[1], x.narrow(0, 3, 3), 0, 0));
  const auto sized = split(x, std::vector<int64_t>{2, 0, 5}, 0);
  ASSERT_EQ(sized.size(), 3u);
  EXPECT_EQ(sized[1].shape(), (Shape{0, 2}));
  EXPECT_TRUE(all_close(sized[2], x.narrow(0, 2, 5), 0, 0));
  const auto cols = split(x, 1, -1);
  ASSERT_EQ(cols.size(), 2u);
  EXPECT_TRUE(all_close(cols[1], x.narrow(1, 1, 1), 0, 0));
  EXPECT_EQ(split(zeros({0, 2}), 4, 0).size(), 1u);
}

TEST(Chunk, FollowsTorchSemantics) {
  auto sizes = [](const std::vector<Tensor>& parts) {
    std::vector<int64_t> s;
    for (const Tensor& p : parts) s.push_back(p.size(0));
    return s;
  };
  EXPECT_EQ(sizes(chunk(zeros({5}), 3)), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(sizes(chunk(zeros({6}), 4)), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(sizes(chunk(zeros({2}), 5)), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(sizes(chunk(zeros({0}), 3)), (std::vector<int64_t>{0, 0, 0}));
  const Tensor x = randn64({2, 6}, 15, false);
  const auto parts = chunk(x, 3, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_TRUE(all_close(parts[2], x.narrow(1, 4, 2), 0, 0));
}

TEST(Split, GradcheckThroughViews) {
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        const auto parts = split(in[0], std::vector<int64_t>{1, 2, 1}, 1);
        return cat({parts[2], parts[0], parts[2]}, 1);
      },
      {randn64({3, 4}, 16)});
  EXPECT_TRUE(r.ok) << r.message;
  r = autograd::gradcheck([](const std::vector<Tensor>& in) { return chunk(in[0], 2, 0)[1]; },
                          {randn64({3, 4}, 17)});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Split, BadArgumentsThrow) {
  const Tensor x = randn64({5, 2}, 18, false);
  const std::string msg = error_of([&] { split(x, std::vector<int64_t>{2, 2}, 0); });
  EXPECT_NE(msg.find("split"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 2]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[5, 2]"), std::string::npos) << msg;
  EXPECT_THROW(split(x, 0, 0), mt::Error);
  EXPECT_THROW(split(x, std::vector<int64_t>{6, -1}, 0), mt::Error);
  EXPECT_THROW(chunk(x, 0, 0), mt::Error);
  EXPECT_THROW(split(x, 2, 2), mt::Error);
}

}  // namespace
}  // namespace mt::runtime
