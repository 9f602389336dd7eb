// Reductions: values against naive references over several dims (keepdim or not, strided
// inputs, 16-bit and integer dtypes, empty and 0-D tensors), bit-identical results for any thread
// count or layout, gradients against finite differences, and errors.
#include "runtime/ops/reduce.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <set>
#include <sstream>

#include "runtime/autograd/gradcheck.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::leaf;
using testing::randn64;
using testing::randn_as;

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::F64);

std::string str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << Shape(v);
  return os.str();
}

struct NaiveReduction {
  Shape shape;                  // output shape
  std::vector<double> sum;      // per output
  std::vector<double> max;      // per output (first maximum)
  std::vector<int64_t> argmax;  // row-major index within the reduced dims
};

// Naive reduction of x over `dims` (wrapped), row-major loops in f64.
NaiveReduction naive_reduce(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  const int64_t nd = x.dim();
  for (auto& d : dims) d = d < 0 ? d + nd : d;
  const std::set<int64_t> red(dims.begin(), dims.end());
  NaiveReduction r;
  Shape kept;
  for (int64_t d = 0; d < nd; ++d) {
    if (!red.count(d)) {
      r.shape.push_back(x.size(d));
      kept.push_back(x.size(d));
    } else if (keepdim) {
      r.shape.push_back(1);
    }
  }
  int64_t nout = 1;
  for (int64_t s : kept) nout *= s;
  r.sum.assign(size_t(nout), 0.0);
  r.max.assign(size_t(nout), -INFINITY);
  r.argmax.assign(size_t(nout), -1);
  const std::vector<double> v = x.to_vector<double>();
  std::vector<int64_t> idx(size_t(nd), 0);
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t k = 0, rr = 0;
    for (int64_t d = 0; d < nd; ++d) {
      if (red.count(d))
        rr = rr * x.size(d) + idx[d];
      else
        k = k * x.size(d) + idx[d];
    }
    r.sum[k] += v[i];
    if (r.argmax[k] < 0 || v[i] > r.max[k]) r.max[k] = v[i], r.argmax[k] = rr;
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < x.size(d)) break;
      idx[d] = 0;
    }
  }
  return r;
}

Tensor as_tensor(const std::vector<double>& v, const Shape& shape) {
  return from_vector<double>(v, shape, kF64);
}

const std::vector<std::vector<int64_t>> kDimSets = {{0},    {1},    {2},       {-1},
                                                    {0, 2}, {1, 2}, {2, 0, 1}, {}};

TEST(Reduce, SumMeanMaxOverDimsMatchNaive) {
  const Tensor a = randn_as({3, 4, 5}, DType::F32, 1);
  const Tensor b = randn_as({5, 3, 4}, DType::F64, 2).permute({1, 2, 0});  // strided [3, 4, 5]
  for (const Tensor& x : {a, b}) {
    for (const auto& dims : kDimSets) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(str(dims) + (keepdim ? " keepdim" : ""));
        const std::vector<int64_t> all = {0, 1, 2};
        const NaiveReduction n = naive_reduce(x, dims.empty() ? all : dims, keepdim);
        const Tensor s = sum(x, dims, keepdim);
        EXPECT_EQ(s.dtype(), x.dtype());
        EXPECT_TRUE(all_close(s, as_tensor(n.sum, n.shape), 1e-6, 1e-6));
        int64_t count = x.numel() / int64_t(n.sum.size());
        std::vector<double> m = n.sum;
        for (double& e : m) e /= double(count);
        EXPECT_TRUE(all_close(mean(x, dims, keepdim), as_tensor(m, n.shape), 1e-6, 1e-6));
        EXPECT_TRUE(all_close(amax(x, dims, keepdim), as_tensor(n.max, n.shape), 0, 0));
      }
    }
    for (int64_t d = -3; d < 3; ++d) {
      for (bool keepdim : {false, true}) {
        const NaiveReduction n = naive_reduce(x, {d}, keepdim);
        const ValuesIndices vi = max(x, d, keepdim);
        EXPECT_TRUE(all_close(vi.values, as_tensor(n.max, n.shape), 0, 0)) << d;
        EXPECT_EQ(vi.indices.dtype(), DType::I64);
        EXPECT_EQ(vi.indices.shape(), n.shape);
        EXPECT_EQ(vi.indices.to_vector<int64_t>(), n.argmax) << d;
        EXPECT_EQ(argmax(x, d, keepdim).to_vector<int64_t>(), n.argmax) << d;
      }
    }
    const NaiveReduction all = naive_reduce(x, {0, 1, 2}, false);
    EXPECT_EQ(sum(x).shape(), Shape{});
    EXPECT_NEAR(sum(x).item<double>(), all.sum[0], 1e-5);
    EXPECT_NEAR(mean(x).item<double>(), all.sum[0] / 60, 1e-6);
    EXPECT_EQ(max(x).item<double>(), all.max[0]);
  }
}

TEST(Reduce, LargeReductionsAcrossChunksAndLayouts) {
  // Sums over > 16384 elements per output (several chunks), in both loop nests.
  const Tensor x = randn_as({40000, 20}, DType::F32, 3);
  const NaiveReduction cols = naive_reduce(x, {0}, false);
  const NaiveReduction rows = naive_reduce(x, {1}, false);
  EXPECT_TRUE(all_close(sum(x, {0}), as_tensor(cols.sum, cols.shape), 1e-4, 1e-6));
  EXPECT_TRUE(all_close(sum(x, {1}), as_tensor(rows.sum, rows.shape), 1e-5, 1e-6));
  EXPECT_TRUE(all_close(amax(x, {0}), as_tensor(cols.max, cols.shape), 0, 0));
  EXPECT_EQ(argmax(x, 0).to_vector<int64_t>(), cols.argmax);
  const Tensor xt = x.t();  // [20, 40000] strided: the other nest, same order, same bits
  EXPECT_TRUE(all_close(sum(xt, {1}), sum(x, {0}), 0, 0));
  EXPECT_TRUE(all_close(sum(x.t().contiguous(), {1}), sum(x, {0}), 0, 0));
  EXPECT_NEAR(sum(x).item<double>(), naive_reduce(x, {0, 1}, false).sum[0], 1e-3);
  // Tied maxima in different chunks: the first one wins in both nests.
  std::vector<int64_t> vals(40000 * 20, 0);
  for (int64_t j = 0; j < 20; ++j) vals[(20000 + j) * 20 + j] = vals[35000 * 20 + j] = 1;
  const Tensor ti = from_vector<int64_t>(vals, {40000, 20}, TensorOptions{}.with_dtype(DType::I64));
  std::vector<int64_t> expected(20);
  for (int64_t j = 0; j < 20; ++j) expected[j] = 20000 + j;
  EXPECT_EQ(argmax(ti, 0).to_vector<int64_t>(), expected);
  EXPECT_EQ(argmax(ti.t(), 1).to_vector<int64_t>(), expected);
  EXPECT_EQ(argmax(ti.t().contiguous(), 1).to_vector<int64_t>(), expected);
}

TEST(Reduce, ResultsDoNotDependOnThreadCount) {
  const Tensor x = randn_as({1 << 20}, DType::F32, 4);
  const Tensor m = randn_as({3000, 700}, DType::F32, 5);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const double s1 = sum(x).item<double>();
  const Tensor c1 = sum(m, {0}), r1 = sum(m, {1}), a1 = argmax(m, 0);
  omp_set_num_threads(2);
  const double s2 = sum(x).item<double>();
  const Tensor c2 = sum(m, {0}), r2 = sum(m, {1}), a2 = argmax(m, 0);
  omp_set_num_threads(before);
  EXPECT_EQ(s1, s2);  // bit-identical
  EXPECT_TRUE(all_close(c1, c2, 0, 0));
  EXPECT_TRUE(all_close(r1, r2, 0, 0));
  EXPECT_EQ(a1.to_vector<int64_t>(), a2.to_vector<int64_t>());
  EXPECT_NEAR(s1, naive_reduce(x, {0}, false).sum[0], 1e-3);
}

TEST(Reduce, SixteenBitFloatsAccumulateInWideType) {
  const Tensor ones_bf16 = ones({4096}, TensorOptions{}.with_dtype(DType::BF16));
  EXPECT_EQ(sum(ones_bf16).item<double>(), 4096.0);  // a bf16 accumulator would stop at 256
  EXPECT_EQ(sum(ones_bf16).dtype(), DType::BF16);
  const Tensor h = randn_as({6, 50}, DType::F16, 6);
  const NaiveReduction n = naive_reduce(h, {1}, false);
  EXPECT_TRUE(all_close(sum(h, {1}), as_tensor(n.sum, n.shape), 1e-2, 1.0 / 512));
  const Tensor b = randn_as({6, 50}, DType::BF16, 7);
  const NaiveReduction nb = naive_reduce(b, {0}, true);
  EXPECT_TRUE(all_close(sum(b, {0}, true), as_tensor(nb.sum, nb.shape), 1e-2, 1.0 / 128));
  EXPECT_TRUE(all_close(amax(b, {0}, true), as_tensor(nb.max, nb.shape), 0, 0));
}

TEST(Reduce, IntegerAndBoolSums) {
  const Tensor a =
      from_vector<int64_t>({1, -2, 3, 4, 5, 6}, {2, 3}, TensorOptions{}.with_dtype(DType::I32));
  EXPECT_EQ(sum(a).dtype(), DType::I64);
  EXPECT_EQ(sum(a).item<int64_t>(), 17);
  EXPECT_EQ(sum(a, {0}).to_vector<int64_t>(), (std::vector<int64_t>{5, 3, 9}));
  EXPECT_EQ(sum(a, {1}, true).to_vector<int64_t>(), (std::vector<int64_t>{2, 15}));
  EXPECT_EQ(max(a, 1).values.to_vector<int64_t>(), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(max(a, 1).values.dtype(), DType::I32);
  const Tensor big = full({3}, 4e9, TensorOptions{}.with_dtype(DType::I64));
  EXPECT_EQ(sum(big).item<int64_t>(), 12000000000);
  const Tensor mask = gt(a, 2.0);
  EXPECT_EQ(sum(mask).item<int64_t>(), 4);
  EXPECT_EQ(sum(mask, {1}).to_vector<int64_t>(), (std::vector<int64_t>{1, 3}));
  EXPECT_THROW(mean(a), mt::Error);
}

TEST(Reduce, EmptyAndZeroDimTensors) {
  const Tensor e = zeros({0, 3}, kF64);
  EXPECT_EQ(sum(e).item<double>(), 0.0);
  EXPECT_EQ(sum(e, {0}).to_vector<double>(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(sum(e, {1}).shape(), (Shape{0}));
  EXPECT_EQ(sum(e, {1}, true).shape(), (Shape{0, 1}));
  EXPECT_TRUE(std::isnan(mean(e).item<double>()));
  EXPECT_THROW(max(e), mt::Error);
  EXPECT_THROW(max(e, 0), mt::Error);
  EXPECT_THROW(amax(e, {0}), mt::Error);
  EXPECT_EQ(amax(e, {1}).shape(), (Shape{0}));  // nothing to reduce per output, no outputs
  const Tensor s = scalar_tensor(2.5, kF64);
  EXPECT_EQ(sum(s).item<double>(), 2.5);
  EXPECT_EQ(sum(s, {0}).shape(), Shape{});
  EXPECT_EQ(max(s).item<double>(), 2.5);
  EXPECT_EQ(max(s, 0).indices.item<int64_t>(), 0);
}

TEST(Reduce, MaxTiesNaNAndErrors) {
  const Tensor x = from_vector<double>({1, 3, 3, 2, NAN, 5}, {2, 3}, kF64);
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>()[0], 1);  // first of the tied maxima
  const ValuesIndices r = max(x, 1);
  EXPECT_EQ(r.values.to_vector<double>()[0], 3.0);
  EXPECT_TRUE(std::isnan(r.values.to_vector<double>()[1]));  // NaN wins, like PyTorch
  EXPECT_EQ(r.indices.to_vector<int64_t>()[1], 1);
  EXPECT_TRUE(std::isnan(max(x).item<double>()));
  EXPECT_THROW(sum(x, {2}), mt::Error);
  EXPECT_THROW(max(x, -3), mt::Error);
  try {
    sum(x, {1, -1});
    FAIL() << "expected an error";
  } catch (const mt::Error& err) {
    EXPECT_NE(std::string(err.what()).find("sum"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("twice"), std::string::npos) << err.what();
  }
}

TEST(Reduce, SumTo) {
  const Tensor x = randn_as({2, 3, 4}, DType::F64, 8);
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{3, 1}, {0, 2}}, {{4}, {0, 1}},    {{1, 1, 4}, {0, 1}},
      {{}, {0, 1, 2}},  {{2, 1, 4}, {1}}, {{1, 3, 4}, {0}}};
  for (const auto& [shape, dims] : cases) {
    const NaiveReduction n = naive_reduce(x, dims, false);
    const Tensor y = sum_to(x, shape);
    EXPECT_EQ(y.shape(), shape);
    EXPECT_TRUE(all_close(y, as_tensor(n.sum, shape), 1e-12, 1e-12)) << str(shape);
  }
  EXPECT_TRUE(sum_to(x, x.shape()).same(x));
  EXPECT_THROW(sum_to(x, {5}), mt::Error);
  EXPECT_THROW(sum_to(x, {1, 2, 3, 4}), mt::Error);
  EXPECT_THROW(sum_to(x, {2, 4}), mt::Error);
}

// ---- gradients ---------------------------------------------------------------------------------

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

void expect_gradcheck(const Fn& fn, const std::vector<Tensor>& inputs, const std::string& what) {
  const auto r = autograd::gradcheck(fn, inputs);
  EXPECT_TRUE(r.ok) << what << "\n" << r.message;
}

TEST(ReduceGrad, SumMeanOverDims) {
  const Tensor x = randn64({3, 4, 2}, 20);
  const Tensor xt = leaf(randn64({2, 4, 3}, 21, false).permute({2, 1, 0}));
  for (const auto& dims : kDimSets) {
    for (bool keepdim : {false, true}) {
      const std::string what = str(dims) + (keepdim ? " keepdim" : "");
      for (const Tensor& in : {x, xt}) {
        expect_gradcheck([&](const auto& v) { return sum(v[0], dims, keepdim); }, {in},
                         "sum " + what);
        expect_gradcheck([&](const auto& v) { return mean(v[0], dims, keepdim); }, {in},
                         "mean " + what);
      }
    }
  }
  expect_gradcheck([](const auto& v) { return sum(v[0]); }, {x}, "sum all");
  expect_gradcheck([](const auto& v) { return mean(v[0]); }, {xt}, "mean all");
}

TEST(ReduceGrad, MaxAmaxSumTo) {
  const Tensor x = randn64({3, 4, 2}, 22);
  for (int64_t d = -3; d < 3; ++d)
    for (bool keepdim : {false, true})
      expect_gradcheck([=](const auto& v) { return max(v[0], d, keepdim).values; }, {x},
                       "max dim " + std::to_string(d));
  expect_gradcheck([](const auto& v) { return max(v[0]); }, {x}, "max all");
  expect_gradcheck([](const auto& v) { return amax(v[0], {0, 2}); }, {x}, "amax");
  expect_gradcheck([](const auto& v) { return amax(v[0], {1}, true); }, {x}, "amax keepdim");
  expect_gradcheck([](const auto& v) { return sum_to(v[0], {4, 1}); }, {x}, "sum_to");
  expect_gradcheck([](const auto& v) { return sum_to(v[0], {}); }, {x}, "sum_to 0-D");
}

TEST(ReduceGrad, TiedMaxima) {
  // max(x, dim) and max(x): the gradient goes to the first maximum; amax splits it evenly.
  const Tensor x = leaf(from_vector<double>({2, 5, 5, 1, 0, 1}, {2, 3}, kF64));
  max(x, 1).values.backward(from_vector<double>({1, 10}, {2}, kF64));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 1, 0, 10, 0, 0}));
  const Tensor y = leaf(from_vector<double>({2, 5, 5, 1, 0, 1}, {2, 3}, kF64));
  amax(y, {1}).backward(from_vector<double>({1, 10}, {2}, kF64));
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{0, 0.5, 0.5, 5, 0, 5}));
  const Tensor z = leaf(from_vector<double>({2, 5, 5, 1, 0, 1}, {2, 3}, kF64));
  max(z).backward();
  EXPECT_EQ(z.grad().to_vector<double>(), (std::vector<double>{0, 1, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace mt::runtime
