// Tests of runtime/ops/sort.h: sort, argsort and topk against std::stable_sort per line, ties,
// NaN, dtypes, non-contiguous inputs, gradcheck and errors.
#include "runtime/ops/sort.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/autograd/gradcheck.h"
#include "runtime/ops/factory.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using mt::testing::all_close;
using mt::testing::randn64;

// NaN above every number, as the op documents.
bool less_nan_last(double a, double b) {
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return a < b;
}

// Reference: every line along `dim` ordered with std::stable_sort, first k kept.
void ref_sort(const Tensor& x, int64_t dim, int64_t k, bool descending, std::vector<double>* values,
              std::vector<int64_t>* indices) {
  const auto xv = x.to_vector<double>();
  const Shape& s = x.shape();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < dim) outer *= s[size_t(d)];
    if (d > dim) inner *= s[size_t(d)];
  }
  const int64_t n = s[size_t(dim)];
  values->assign(size_t(outer * k * inner), 0);
  indices->assign(size_t(outer * k * inner), 0);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      auto val = [&](int64_t i) { return xv[size_t((o * n + i) * inner + j)]; };
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return descending ? less_nan_last(val(b), val(a)) : less_nan_last(val(a), val(b));
      });
      for (int64_t i = 0; i < k; ++i) {
        (*values)[size_t((o * k + i) * inner + j)] = val(order[size_t(i)]);
        (*indices)[size_t((o * k + i) * inner + j)] = order[size_t(i)];
      }
    }
  }
}

void expect_matches(const ValuesIndices& r, const Tensor& x, int64_t dim, int64_t k,
                    bool descending, const std::string& what) {
  std::vector<double> values;
  std::vector<int64_t> indices;
  ref_sort(x, dim, k, descending, &values, &indices);
  Shape shape = x.shape();
  shape[size_t(dim)] = k;
  ASSERT_EQ(r.values.shape(), shape) << what;
  ASSERT_EQ(r.indices.shape(), shape) << what;
  EXPECT_EQ(r.values.dtype(), x.dtype()) << what;
  EXPECT_EQ(r.indices.dtype(), DType::I64) << what;
  const auto got = r.values.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i] == values[i] || (std::isnan(got[i]) && std::isnan(values[i])))
        << what << " at " << i << ": " << got[i] << " vs " << values[i];
  }
  EXPECT_EQ(r.indices.to_vector<int64_t>(), indices) << what;
}

// Values from a small set, so lines have many ties.
Tensor tied_values(const Shape& shape, DType dtype, uint64_t seed) {
  const auto r = mt::testing::randn_as(shape, DType::F64, seed).to_vector<double>();
  std::vector<double> v(r.size());
  for (size_t i = 0; i < r.size(); ++i) v[i] = std::round(r[i] * 1.5);
  return from_vector<double>(v, shape, TensorOptions{}.with_dtype(dtype));
}

TEST(Sort, MatchesStableReferenceWithTiesEveryDim) {
  const Tensor x = tied_values({3, 7, 4}, DType::F32, 1);
  for (int64_t dim : {0, 1, 2}) {
    for (bool desc : {false, true}) {
      expect_matches(sort(x, dim, desc), x, dim, x.size(dim), desc,
                     "dim " + std::to_string(dim) + (desc ? " desc" : " asc"));
    }
  }
  const ValuesIndices last = sort(x);  // dim -1, ascending
  expect_matches(last, x, 2, 4, false, "default dim");
}

TEST(Sort, NonContiguousInput) {
  const Tensor x = randn64({5, 6}, 2, false).t();  // [6, 5]
  ASSERT_FALSE(x.is_contiguous());
  for (int64_t dim : {0, 1}) expect_matches(sort(x, dim, true), x, dim, x.size(dim), true, "t");
  const Tensor sliced = randn64({4, 9}, 3, false).slice(1, 1, 9, 2);  // [4, 4], stride 2
  expect_matches(sort(sliced, 1), sliced, 1, 4, false, "sliced");
}

TEST(Sort, NaNSortsAsLargest) {
  const double nan = std::nan("");
  const Tensor x = from_vector<double>({3, nan, 1, nan, 2}, {5});
  const ValuesIndices asc = sort(x);
  EXPECT_EQ(asc.indices.to_vector<int64_t>(), (std::vector<int64_t>{2, 4, 0, 1, 3}));
  const ValuesIndices desc = sort(x, 0, true);
  EXPECT_EQ(desc.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 3, 0, 4, 2}));
  const auto dv = desc.values.to_vector<double>();
  EXPECT_TRUE(std::isnan(dv[0]) && std::isnan(dv[1]));
  EXPECT_EQ(dv[2], 3);
  EXPECT_EQ(topk(x, 3).indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 3, 0}));
  EXPECT_EQ(topk(x, 2, 0, false).indices.to_vector<int64_t>(), (std::vector<int64_t>{2, 4}));
}

TEST(Sort, IntegerAndHalfDtypes) {
  for (DType dt : {DType::I32, DType::I64, DType::BF16, DType::F16, DType::F64}) {
    const Tensor x = tied_values({4, 9}, dt, 4);
    for (bool desc : {false, true}) {
      expect_matches(sort(x, 1, desc), x, 1, 9, desc, std::string(dtype_name(dt)));
      expect_matches(topk(x, 3, 0, desc), x, 0, 3, desc, "topk " + std::string(dtype_name(dt)));
    }
  }
}

TEST(Sort, ArgsortEqualsSortIndices) {
  const Tensor x = tied_values({5, 6}, DType::F32, 5);
  for (bool desc : {false, true}) {
    EXPECT_EQ(argsort(x, 0, desc).to_vector<int64_t>(),
              sort(x, 0, desc).indices.to_vector<int64_t>());
  }
  const Tensor leaf = randn64({3, 4}, 6);
  EXPECT_FALSE(argsort(leaf).requires_grad());
  EXPECT_TRUE(sort(leaf).values.requires_grad());
}

TEST(Sort, ZeroDimAndEmpty) {
  const ValuesIndices r = sort(scalar_tensor(2.5));
  EXPECT_EQ(r.values.dim(), 0);
  EXPECT_EQ(r.values.item<double>(), 2.5);
  EXPECT_EQ(r.indices.item<int64_t>(), 0);
  const ValuesIndices e = sort(zeros({3, 0}), 1);
  EXPECT_EQ(e.values.shape(), (Shape{3, 0}));
  EXPECT_EQ(topk(zeros({0, 4}), 2).indices.shape(), (Shape{0, 2}));
}

TEST(Sort, Gradcheck) {
  const Tensor x = randn64({3, 5}, 7);
  for (int64_t dim : {0, -1}) {
    for (bool desc : {false, true}) {
      auto r = autograd::gradcheck(
          [&](const std::vector<Tensor>& in) { return sort(in[0], dim, desc).values; }, {x});
      EXPECT_TRUE(r.ok) << "dim " << dim << ": " << r.message;
    }
  }
  const Tensor xt = randn64({5, 3}, 8, false).t().set_requires_grad(true);
  auto r = autograd::gradcheck([&](const std::vector<Tensor>& in) { return sort(in[0], 1).values; },
                               {xt});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(TopK, MatchesReferenceWithTies) {
  const Tensor x = tied_values({4, 8, 3}, DType::F32, 9);
  for (int64_t dim : {0, 1, 2}) {
    for (int64_t k : {int64_t(0), int64_t(1), x.size(dim) - 1, x.size(dim)}) {
      for (bool largest : {true, false}) {
        const std::string what = "dim " + std::to_string(dim) + " k " + std::to_string(k) +
                                 (largest ? " largest" : " smallest");
        expect_matches(topk(x, k, dim, largest), x, dim, k, largest, what);
        expect_matches(topk(x, k, dim, largest, false), x, dim, k, largest, what + " unsorted");
      }
    }
  }
}

TEST(TopK, TiesPickLowerIndexFirst) {
  const Tensor x = from_vector<double>({1, 5, 5, 2, 5, 1}, {6});
  EXPECT_EQ(topk(x, 2).indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(topk(x, 2, 0, false).indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 5}));
}

TEST(TopK, Gradcheck) {
  const Tensor x = randn64({4, 6}, 10);
  for (int64_t dim : {0, 1}) {
    for (bool largest : {true, false}) {
      auto r = autograd::gradcheck(
          [&](const std::vector<Tensor>& in) { return topk(in[0], 3, dim, largest).values; }, {x});
      EXPECT_TRUE(r.ok) << "dim " << dim << ": " << r.message;
    }
  }
  const Tensor xt = randn64({6, 4}, 11, false).t().set_requires_grad(true);
  auto r = autograd::gradcheck([&](const std::vector<Tensor>& in) { return topk(in[0], 2).values; },
                               {xt});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(TopK, BadKOrDimThrows) {
  const Tensor x = randn64({3, 4}, 12, false);
  try {
    topk(x, 9, 1);
    ADD_FAILURE() << "expected an error";
  } catch (const mt::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("topk"), std::string::npos) << msg;
    EXPECT_NE(msg.find("k = 9"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
  }
  EXPECT_THROW(topk(x, -1), mt::Error);
  EXPECT_THROW(sort(x, 2), mt::Error);
  EXPECT_THROW(argsort(x, -3), mt::Error);
}

}  // namespace
}  // namespace mt::runtime
