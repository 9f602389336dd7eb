// Tests of runtime/ops/index.h: values against naive loops, gradcheck, index errors, determinism.
#include "runtime/ops/index.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>

#include "runtime/autograd/gradcheck.h"
#include "runtime/core/grad_mode.h"
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

TensorOptions i64() { return TensorOptions{}.with_dtype(DType::I64); }

Tensor make_index(const std::vector<int64_t>& v, const Shape& shape, DType dtype = DType::I64) {
  return from_vector<int64_t>(v, shape, TensorOptions{}.with_dtype(dtype));
}

// Random indices in [0, high) (repeats likely), reproducible.
std::vector<int64_t> random_indices(int64_t n, int64_t high, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, high - 1);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& e : v) e = dist(gen);
  return v;
}

Tensor from_ref(const std::vector<double>& v, const Shape& shape, DType dtype = DType::F64) {
  return from_vector<double>(v, shape, TensorOptions{}.with_dtype(dtype));
}

using mt::testing::error_of;

// ---- references ------------------------------------------------------------------------------

Tensor ref_index_select(const Tensor& x, int64_t dim, const std::vector<int64_t>& idx) {
  Shape out_shape = x.shape();
  out_shape[size_t(dim)] = int64_t(idx.size());
  const auto xv = x.to_vector<double>();
  std::vector<double> out(size_t(numel_of(out_shape)));
  for (int64_t f = 0; f < int64_t(out.size()); ++f) {
    Coords c = unravel(f, out_shape);
    c[size_t(dim)] = idx[size_t(c[size_t(dim)])];
    out[size_t(f)] = xv[size_t(ravel(c, x.shape()))];
  }
  return from_ref(out, out_shape);
}

Tensor ref_index_add(const Tensor& x, int64_t dim, const std::vector<int64_t>& idx,
                     const Tensor& source, double alpha) {
  auto out = x.to_vector<double>();
  const auto sv = source.to_vector<double>();
  for (int64_t f = 0; f < int64_t(sv.size()); ++f) {
    Coords c = unravel(f, source.shape());
    c[size_t(dim)] = idx[size_t(c[size_t(dim)])];
    out[size_t(ravel(c, x.shape()))] += alpha * sv[size_t(f)];
  }
  return from_ref(out, x.shape());
}

Tensor ref_gather(const Tensor& x, int64_t dim, const Tensor& index) {
  const auto xv = x.to_vector<double>();
  const auto iv = index.to_vector<int64_t>();
  std::vector<double> out(iv.size());
  for (int64_t f = 0; f < int64_t(iv.size()); ++f) {
    Coords c = unravel(f, index.shape());
    c[size_t(dim)] = iv[size_t(f)];
    out[size_t(f)] = xv[size_t(ravel(c, x.shape()))];
  }
  return from_ref(out, index.shape());
}

// Positions in row-major order: for fixed other coords, increasing along dim (last write wins).
Tensor ref_scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                   bool accumulate) {
  auto out = x.to_vector<double>();
  const auto iv = index.to_vector<int64_t>();
  const auto sv = src.to_vector<double>();
  for (int64_t f = 0; f < int64_t(iv.size()); ++f) {
    Coords c = unravel(f, index.shape());
    const double v = sv[size_t(ravel(c, src.shape()))];
    c[size_t(dim)] = iv[size_t(f)];
    double& o = out[size_t(ravel(c, x.shape()))];
    o = accumulate ? o + v : v;
  }
  return from_ref(out, x.shape());
}

// ---- index_select ----------------------------------------------------------------------------

TEST(IndexSelect, MatchesReferenceEveryDim) {
  const Tensor x = randn64({3, 4, 5}, 1, false);
  for (int64_t dim : {0, 1, 2, -1}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    const int64_t n = x.size(d);
    const std::vector<int64_t> idx = {n - 1, 0, n - 1, 1, 0};
    const Tensor out = index_select(x, dim, make_index(idx, {5}));
    EXPECT_TRUE(all_close(out, ref_index_select(x, d, idx), 0, 0)) << "dim " << dim;
  }
}

TEST(IndexSelect, NonContiguousInputAndI32Index) {
  const Tensor x = randn64({5, 6}, 2, false).transpose(0, 1);  // [6, 5]
  ASSERT_FALSE(x.is_contiguous());
  const std::vector<int64_t> idx = {4, 4, 2};
  for (int64_t dim : {0, 1}) {
    const Tensor out = index_select(x, dim, make_index(idx, {3}, DType::I32));
    EXPECT_TRUE(all_close(out, ref_index_select(x, dim, idx), 0, 0)) << "dim " << dim;
  }
}

TEST(IndexSelect, IntegerBoolAndHalfValuesCopyExactly) {
  const Tensor x64 = from_vector<int64_t>({1, -2, 3, 40, 5, 6}, {3, 2}, i64());
  EXPECT_EQ(index_select(x64, 0, make_index({2, 0}, {2})).to_vector<int64_t>(),
            (std::vector<int64_t>{5, 6, 1, -2}));
  const Tensor xb =
      from_vector<int64_t>({1, 0, 0, 1}, {2, 2}, TensorOptions{}.with_dtype(DType::Bool));
  EXPECT_EQ(index_select(xb, 1, make_index({1, 1, 0}, {3})).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 0, 1, 1, 1, 0}));
  const Tensor xh = mt::testing::randn_as({4, 3}, DType::BF16, 3);
  const std::vector<int64_t> idx = {3, 1};
  EXPECT_TRUE(
      all_close(index_select(xh, 0, make_index(idx, {2})), ref_index_select(xh, 0, idx), 0, 0));
}

TEST(IndexSelect, EmptyIndexGivesEmptyDim) {
  const Tensor x = randn64({3, 4}, 4, false);
  const Tensor out = index_select(x, 1, make_index({}, {0}));
  EXPECT_EQ(out.shape(), (Shape{3, 0}));
}

TEST(IndexSelect, Gradcheck) {
  const Tensor x = randn64({4, 3}, 5);
  const Tensor idx = make_index({3, 0, 3, 3, 1}, {5});
  for (int64_t dim : {0, 1}) {
    const Tensor index = dim == 0 ? idx : make_index({2, 2, 0}, {3});
    auto r = autograd::gradcheck(
        [&](const std::vector<Tensor>& in) { return index_select(in[0], dim, index); }, {x});
    EXPECT_TRUE(r.ok) << "dim " << dim << ": " << r.message;
  }
  const Tensor xt = randn64({3, 4}, 6, false).transpose(0, 1).set_requires_grad(true);
  auto r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return index_select(in[0], 0, idx); }, {xt});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(IndexSelect, OutOfRangeIndexThrowsNamingOpValueDimAndSize) {
  const Tensor x = randn64({3, 4}, 7, false);
  const std::string msg = error_of([&] { index_select(x, 1, make_index({0, 7, 1}, {3})); });
  EXPECT_NE(msg.find("index_select"), std::string::npos) << msg;
  EXPECT_NE(msg.find("index 7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dim 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("size 4"), std::string::npos) << msg;
  EXPECT_THROW(index_select(x, 0, make_index({-1}, {1})), mt::Error);
  EXPECT_THROW(index_select(x, 0, make_index({3}, {1}, DType::I32)), mt::Error);
}

TEST(IndexSelect, BadIndexDtypeShapeOrDimThrows) {
  const Tensor x = randn64({3, 4}, 8, false);
  EXPECT_THROW(index_select(x, 0, from_ref({0, 1}, {2})), mt::Error);
  EXPECT_THROW(index_select(x, 0, make_index({0, 1}, {1, 2})), mt::Error);
  EXPECT_THROW(index_select(x, 2, make_index({0}, {1})), mt::Error);
}

// ---- index_add -------------------------------------------------------------------------------

TEST(IndexAdd, MatchesReferenceWithRepeatedIndices) {
  const Tensor x = randn64({4, 3, 5}, 10, false);
  for (int64_t dim : {0, 1, 2}) {
    const std::vector<int64_t> idx = random_indices(7, x.size(dim), uint32_t(dim));
    Shape src_shape = x.shape();
    src_shape[size_t(dim)] = 7;
    const Tensor src = randn64(src_shape, 11 + uint64_t(dim), false);
    const Tensor out = index_add(x, dim, make_index(idx, {7}), src, 2.5);
    EXPECT_TRUE(all_close(out, ref_index_add(x, dim, idx, src, 2.5), 1e-12, 1e-12))
        << "dim " << dim;
  }
}

TEST(IndexAdd, NonContiguousSourceAndI32Index) {
  const Tensor x = randn64({5, 4}, 12, false);
  const Tensor src = randn64({4, 3}, 13, false).transpose(0, 1);  // [3, 4]
  const std::vector<int64_t> idx = {4, 0, 4};
  const Tensor out = index_add(x, 0, make_index(idx, {3}, DType::I32), src);
  EXPECT_TRUE(all_close(out, ref_index_add(x, 0, idx, src, 1.0), 1e-12, 1e-12));
}

TEST(IndexAdd, InPlaceOnContiguousAndStridedSelf) {
  const Tensor x = randn64({4, 3}, 14, false);
  const Tensor expected = ref_index_add(x, 0, {1, 1, 3}, ones({3, 3}, x.options()), -1.0);
  const Tensor self = x.clone();
  const uint64_t v0 = self.version();
  const Tensor& r =
      index_add_(self, 0, make_index({1, 1, 3}, {3}), ones({3, 3}, x.options()), -1.0);
  EXPECT_TRUE(r.same(self));
  EXPECT_GT(self.version(), v0);
  EXPECT_TRUE(all_close(self, expected, 1e-12, 1e-12));

  const Tensor base = x.t().contiguous();  // [3, 4]
  const Tensor view = base.t();            // [4, 3], strided, aliases base
  ASSERT_FALSE(view.is_contiguous());
  index_add_(view, 0, make_index({1, 1, 3}, {3}), ones({3, 3}, x.options()), -1.0);
  EXPECT_TRUE(all_close(base.t(), expected, 1e-12, 1e-12));
}

TEST(IndexAdd, IntegerValuesAndBf16) {
  const Tensor x = from_vector<int64_t>({1, 2, 3, 4}, {2, 2}, i64());
  const Tensor src = from_vector<int64_t>({10, 20, 30, 40, 50, 60}, {2, 3}, i64());
  const Tensor out = index_add(x, 1, make_index({1, 0, 1}, {3}), src, 2.0);
  EXPECT_EQ(out.to_vector<int64_t>(),
            (std::vector<int64_t>{1 + 40, 2 + 20 + 60, 3 + 100, 4 + 80 + 120}));
  EXPECT_THROW(index_add(x, 1, make_index({1, 0, 1}, {3}), src, 0.5), mt::Error);

  const Tensor xh = mt::testing::randn_as({3, 8}, DType::BF16, 15);
  const Tensor sh = mt::testing::randn_as({2, 8}, DType::BF16, 16);
  const Tensor outh = index_add(xh, 0, make_index({2, 2}, {2}), sh);
  EXPECT_EQ(outh.dtype(), DType::BF16);
  EXPECT_TRUE(all_close(outh, ref_index_add(xh, 0, {2, 2}, sh, 1.0), 0.05, 0.02));
}

TEST(IndexAdd, Gradcheck) {
  const Tensor x = randn64({4, 5}, 17);
  const Tensor src = randn64({4, 3}, 18);
  const Tensor idx = make_index({2, 4, 2}, {3});
  auto r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return index_add(in[0], 1, idx, in[1], 1.5); },
      {x, src});
  EXPECT_TRUE(r.ok) << r.message;
  const Tensor src_t = randn64({5, 3}, 19, false).transpose(0, 1).set_requires_grad(true);
  const Tensor idx0 = make_index({0, 0, 3}, {3});
  r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return index_add(in[0], 0, idx0, in[1]); },
      {randn64({4, 5}, 20), src_t});
  EXPECT_TRUE(r.ok) << r.message;
}

// Accumulation order must not depend on the OpenMP thread count (shapes large enough that the
// kernel runs in parallel, many repeated indices).
TEST(IndexAdd, RepeatedIndicesBitIdenticalAcrossThreadCounts) {
  const int saved = omp_get_max_threads();
  struct Case {
    Shape x, src;
    int64_t dim;
  };
  for (const Case& c : {Case{{64, 1024}, {1000, 1024}, 0}, Case{{256, 16}, {256, 1000}, 1}}) {
    const int64_t n = c.src[size_t(c.dim)];
    const std::vector<int64_t> idx = random_indices(n, c.x[size_t(c.dim)], 21);
    const Tensor x = mt::testing::randn_as(c.x, DType::F32, 22);
    const Tensor src = mt::testing::randn_as(c.src, DType::F32, 23);
    const Tensor index = make_index(idx, {n});
    omp_set_num_threads(1);
    const auto one = index_add(x, c.dim, index, src).to_vector<float>();
    omp_set_num_threads(2);
    const auto two = index_add(x, c.dim, index, src).to_vector<float>();
    omp_set_num_threads(saved);
    ASSERT_EQ(one.size(), two.size());
    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0)
        << "dim " << c.dim;
    EXPECT_TRUE(all_close(from_ref(std::vector<double>(two.begin(), two.end()), c.x),
                          ref_index_add(x, c.dim, idx, src, 1.0), 1e-3, 1e-4));
  }
}

TEST(IndexAdd, BadInputsThrow) {
  const Tensor x = randn64({4, 5}, 24, false);
  const Tensor idx = make_index({0, 1}, {2});
  const std::string msg = error_of([&] { index_add(x, 0, idx, randn64({2, 4}, 25, false)); });
  EXPECT_NE(msg.find("index_add"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 4]"), std::string::npos) << msg;
  EXPECT_THROW(index_add(x, 0, idx, zeros({2, 5})), mt::Error);  // f32 source into f64
  const std::string range = error_of([&] {
    index_add(x, 1, make_index({5}, {1}), zeros({4, 1}, x.options()));
  });
  EXPECT_NE(range.find("index_add: index 5"), std::string::npos) << range;
  EXPECT_NE(range.find("dim 1 of size 5"), std::string::npos) << range;
  const Tensor leaf = randn64({4, 5}, 26);
  EXPECT_THROW(index_add_(leaf, 0, idx, zeros({2, 5}, x.options())), mt::Error);
  {
    NoGradGuard guard;
    EXPECT_NO_THROW(index_add_(leaf, 0, idx, zeros({2, 5}, x.options())));
  }
  const Tensor b = zeros({2, 2}, TensorOptions{}.with_dtype(DType::Bool));
  EXPECT_THROW(index_add(b, 0, idx, b), mt::Error);
}

// ---- index_copy_ -----------------------------------------------------------------------------

// index_copy_ is scatter along dim with a whole slice per index: the reference is ref_scatter with
// the index spread over the source's shape.
Tensor ref_index_copy(const Tensor& x, int64_t dim, const std::vector<int64_t>& idx,
                      const Tensor& source) {
  std::vector<int64_t> spread(size_t(source.numel()));
  for (int64_t f = 0; f < source.numel(); ++f)
    spread[size_t(f)] = idx[size_t(unravel(f, source.shape())[size_t(dim)])];
  return ref_scatter(x, dim, make_index(spread, source.shape()), source, false);
}

TEST(IndexCopy, MatchesReferenceEveryDimLastRepeatWins) {
  for (int64_t dim : {0, 1, 2}) {
    const Tensor x = randn64({4, 3, 5}, 30 + uint64_t(dim), false);
    const std::vector<int64_t> idx = random_indices(6, x.size(dim), 40 + uint32_t(dim));
    Shape src_shape = x.shape();
    src_shape[size_t(dim)] = 6;
    const Tensor src = randn64(src_shape, 50 + uint64_t(dim), false);
    const Tensor expected = ref_index_copy(x, dim, idx, src);
    const Tensor self = x.clone();
    const uint64_t v0 = self.version();
    EXPECT_TRUE(index_copy_(self, dim, make_index(idx, {6}), src).same(self));
    EXPECT_GT(self.version(), v0);
    EXPECT_EQ(self.to_vector<double>(), expected.to_vector<double>()) << "dim " << dim;
  }
  // Repeated rows: the last one's values.
  const Tensor self = zeros({3, 2}, TensorOptions{}.with_dtype(DType::F64));
  index_copy_(self, 0, make_index({1, 1}, {2}), from_ref({1, 2, 3, 4}, {2, 2}));
  EXPECT_EQ(self.to_vector<double>(), (std::vector<double>{0, 0, 3, 4, 0, 0}));
}

TEST(IndexCopy, StridedSelfExpandedSourceI32IndexAndIntegers) {
  const Tensor base = randn64({3, 4}, 60, false);  // self is its [4, 3] transpose
  const Tensor view = base.t();
  const Tensor expected =
      ref_index_copy(view.contiguous(), 0, {3, 0}, zeros({2, 3}, view.options()));
  index_copy_(view, 0, make_index({3, 0}, {2}, DType::I32),
              zeros({1, 1}, view.options()).expand({2, 3}));
  EXPECT_EQ(base.t().contiguous().to_vector<double>(), expected.to_vector<double>());

  const Tensor ints = from_vector<int64_t>({1, 2, 3, 4}, {4}, i64());
  index_copy_(ints, 0, make_index({2}, {1}), from_vector<int64_t>({9}, {1}, i64()));
  EXPECT_EQ(ints.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 9, 4}));
}

TEST(IndexCopy, BadInputsThrow) {
  const Tensor x = randn64({4, 5}, 70, false);
  const Tensor idx = make_index({0, 1}, {2});
  const std::string shape = error_of([&] { index_copy_(x, 0, idx, randn64({2, 4}, 71, false)); });
  EXPECT_NE(shape.find("index_copy_"), std::string::npos) << shape;
  EXPECT_NE(shape.find("[2, 5]"), std::string::npos) << shape;
  const std::string range = error_of([&] {
    index_copy_(x, 1, make_index({5}, {1}), zeros({4, 1}, x.options()));
  });
  EXPECT_NE(range.find("index_copy_: index 5"), std::string::npos) << range;
  EXPECT_THROW(index_copy_(x, 0, idx, zeros({2, 5})), mt::Error);  // f32 source into f64
  const Tensor leaf = randn64({4, 5}, 72);
  EXPECT_THROW(index_copy_(leaf, 0, idx, zeros({2, 5}, x.options())), mt::Error);
  {
    NoGradGuard guard;
    EXPECT_NO_THROW(index_copy_(leaf, 0, idx, zeros({2, 5}, x.options())));
  }
}

// ---- gather ----------------------------------------------------------------------------------

TEST(Gather, MatchesReferenceEveryDim) {
  const Tensor x = randn64({4, 5, 6}, 30, false);
  for (int64_t dim : {0, 1, 2}) {
    Shape is = {3, 4, 5};
    is[size_t(dim)] = 7;  // may exceed x along dim
    const Tensor index =
        make_index(random_indices(numel_of(is), x.size(dim), uint32_t(31 + dim)), is);
    EXPECT_TRUE(all_close(gather(x, dim, index), ref_gather(x, dim, index), 0, 0)) << "dim " << dim;
  }
}

TEST(Gather, NonContiguousInputAndIndex) {
  const Tensor x = randn64({5, 4}, 32, false).t();  // [4, 5]
  const Tensor index =
      make_index(random_indices(12, 5, 33), {4, 3}, DType::I32).t().contiguous().t();  // [4, 3]
  ASSERT_FALSE(index.is_contiguous());
  EXPECT_TRUE(all_close(gather(x, 1, index), ref_gather(x, 1, index), 0, 0));
  const Tensor xi = from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}, i64());
  EXPECT_EQ(gather(xi, 1, make_index({2, 2, 0, 1}, {2, 2})).to_vector<int64_t>(),
            (std::vector<int64_t>{3, 3, 4, 5}));
}

TEST(Gather, Gradcheck) {
  const Tensor x = randn64({3, 4}, 34);
  for (int64_t dim : {0, 1}) {
    const Tensor index = make_index(random_indices(6, x.size(dim), 35), {3, 2});
    auto r = autograd::gradcheck(
        [&](const std::vector<Tensor>& in) { return gather(in[0], dim, index); }, {x});
    EXPECT_TRUE(r.ok) << "dim " << dim << ": " << r.message;
  }
  const Tensor xt = randn64({4, 3}, 36, false).t().set_requires_grad(true);
  const Tensor index = make_index({0, 0, 1, 3, 3, 3}, {3, 2});
  auto r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return gather(in[0], 1, index); }, {xt});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Gather, BadInputsThrow) {
  const Tensor x = randn64({3, 6}, 37, false);
  const std::string msg = error_of([&] { gather(x, 1, make_index({0, 6}, {1, 2})); });
  EXPECT_NE(msg.find("gather: index 6"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dim 1 of size 6"), std::string::npos) << msg;
  EXPECT_THROW(gather(x, 1, make_index({0, 1}, {2})), mt::Error);           // ndim
  EXPECT_THROW(gather(x, 1, make_index({0, 0, 0, 0}, {4, 1})), mt::Error);  // 4 > 3 at dim 0
  EXPECT_THROW(gather(x, 0, make_index({-1}, {1, 1})), mt::Error);
}

// ---- scatter / scatter_add -------------------------------------------------------------------

TEST(Scatter, ReplaceMatchesReferenceLastWriteWins) {
  const Tensor x = randn64({4, 5}, 40, false);
  const Tensor src = randn64({3, 6}, 41, false);  // larger than index at dim 1
  for (int64_t dim : {0, 1}) {
    const Tensor index = make_index(random_indices(15, x.size(dim), uint32_t(42 + dim)), {3, 5});
    EXPECT_TRUE(
        all_close(scatter(x, dim, index, src), ref_scatter(x, dim, index, src, false), 0, 0))
        << "dim " << dim;
  }
  const Tensor one = zeros({3}, x.options());
  const Tensor out = scatter(one, 0, make_index({1, 1, 1}, {3}), from_ref({7, 8, 9}, {3}));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{0, 9, 0}));
}

TEST(ScatterAdd, MatchesReferenceWithRepeatedIndices) {
  const Tensor x = randn64({3, 4, 5}, 43, false);
  for (int64_t dim : {0, 1, 2}) {
    Shape is = {3, 4, 5};
    is[size_t(dim)] = 8;
    const Tensor index =
        make_index(random_indices(numel_of(is), x.size(dim), uint32_t(44 + dim)), is);
    const Tensor big_src = randn64({8, 8, 8}, 46 + uint64_t(dim), false);  // >= index
    EXPECT_TRUE(all_close(scatter_add(x, dim, index, big_src),
                          ref_scatter(x, dim, index, big_src, true), 1e-12, 1e-12))
        << "dim " << dim;
  }
  const Tensor xi = zeros({2, 2}, i64());
  const Tensor out = scatter_add(xi, 1, make_index({1, 1, 1, 0, 0, 0}, {2, 3}),
                                 from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}, i64()));
  EXPECT_EQ(out.to_vector<int64_t>(), (std::vector<int64_t>{0, 6, 15, 0}));
}

TEST(Scatter, NonContiguousSrc) {
  const Tensor x = randn64({4, 3}, 47, false);
  const Tensor src = randn64({3, 4}, 48, false).t();  // [4, 3]
  const Tensor index = make_index({3, 0, 1, 1, 2, 0}, {2, 3}, DType::I32);
  EXPECT_TRUE(all_close(scatter(x, 0, index, src), ref_scatter(x, 0, index, src, false), 0, 0));
  EXPECT_TRUE(
      all_close(scatter_add(x, 0, index, src), ref_scatter(x, 0, index, src, true), 1e-12, 1e-12));
}

TEST(Scatter, Gradcheck) {
  // Distinct targets along dim (a replaced element has one source), src larger than index.
  const Tensor index = make_index({2, 0, 3, 1, 1, 3, 0, 2}, {2, 4});  // dim 1: rows distinct
  auto r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return scatter(in[0], 1, index, in[1]); },
      {randn64({3, 4}, 49), randn64({2, 5}, 50)});
  EXPECT_TRUE(r.ok) << r.message;
  const Tensor src_t = randn64({5, 3}, 51, false).t().set_requires_grad(true);  // [3, 5]
  const Tensor index0 = make_index({1, 0, 2, 0, 2, 1}, {2, 3});  // dim 0: columns distinct
  r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return scatter(in[0], 0, index0, in[1]); },
      {randn64({3, 3}, 52), src_t});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(ScatterAdd, Gradcheck) {
  const Tensor index = make_index({1, 1, 0, 3, 3, 3, 2, 1}, {2, 4});
  auto r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return scatter_add(in[0], 1, index, in[1]); },
      {randn64({3, 4}, 53), randn64({2, 5}, 54)});
  EXPECT_TRUE(r.ok) << r.message;
  const Tensor src_t = randn64({4, 3}, 55, false).t().set_requires_grad(true);  // [3, 4]
  r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return scatter_add(in[0], 0, index, in[1]); },
      {randn64({4, 4}, 56), src_t});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(ScatterAdd, RepeatedIndicesBitIdenticalAcrossThreadCounts) {
  const int saved = omp_get_max_threads();
  const Shape is = {256, 2048};
  const Tensor index = make_index(random_indices(numel_of(is), 16, 57), is);
  const Tensor x = mt::testing::randn_as({16, 2048}, DType::F32, 58);
  const Tensor src = mt::testing::randn_as(is, DType::F32, 59);
  omp_set_num_threads(1);
  const auto one = scatter_add(x, 0, index, src).to_vector<float>();
  omp_set_num_threads(2);
  const auto two = scatter_add(x, 0, index, src).to_vector<float>();
  omp_set_num_threads(saved);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
}

TEST(Scatter, BadInputsThrow) {
  const Tensor x = randn64({3, 4}, 60, false);
  const Tensor src = randn64({3, 4}, 61, false);
  const std::string msg = error_of([&] {
    scatter_add(x, 0, make_index({0, 1, 2, 3}, {1, 4}), src);
  });
  EXPECT_NE(msg.find("scatter_add: index 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dim 0 of size 3"), std::string::npos) << msg;
  EXPECT_THROW(scatter(x, 0, make_index({0}, {1}), src), mt::Error);                 // ndim
  EXPECT_THROW(scatter(x, 0, make_index({0, 0, 0, 0, 0}, {1, 5}), src), mt::Error);  // > x
  EXPECT_THROW(scatter(x, 0, make_index({0, 0, 0, 0}, {4, 1}), src.narrow(0, 0, 2)),
               mt::Error);  // > src
  EXPECT_THROW(scatter(x, 0, make_index({0}, {1, 1}), src.to(DType::F32)), mt::Error);
}

}  // namespace
}  // namespace mt::runtime
