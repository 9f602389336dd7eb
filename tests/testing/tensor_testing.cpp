#include "tests/testing/tensor_testing.h"

#include <cmath>
#include <sstream>

#include "runtime/ops/factory.h"

namespace mt::testing {

Tensor randn64(const Shape& shape, uint64_t seed, bool requires_grad, const std::string& name) {
  return runtime::randn(shape, runtime::RandomKey(seed, name),
                        runtime::TensorOptions{}.with_dtype(runtime::DType::F64)
                            .with_requires_grad(requires_grad));
}

Tensor randn_as(const Shape& shape, runtime::DType dtype, uint64_t seed, const std::string& name) {
  return runtime::randn(shape, runtime::RandomKey(seed, name),
                        runtime::TensorOptions{}.with_dtype(dtype));
}

Tensor leaf(const Tensor& t) {
  Tensor d = t.detach();
  d.set_requires_grad(true);
  return d;
}

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> c(shape.size());
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    c[size_t(d)] = flat % shape[size_t(d)];
    flat /= shape[size_t(d)];
  }
  return c;
}

int64_t ravel(const std::vector<int64_t>& coords, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + coords[d];
  return flat;
}

::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double atol, double rtol) {
  if (a.shape() != b.shape()) {
    std::ostringstream os;
    os << "shapes differ: " << mt::detail::concat(a.shape(), " vs ", b.shape());
    return ::testing::AssertionFailure() << os.str();
  }
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  size_t worst = 0, bad = 0;
  double worst_excess = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    const double tol = atol + rtol * std::abs(vb[i]);
    const double err = std::abs(va[i] - vb[i]);
    const bool both_nan = std::isnan(va[i]) && std::isnan(vb[i]);
    if (!both_nan && !(err <= tol)) {
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err - tol;
      if (bad == 1 || excess > worst_excess) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << va.size() << " elements differ; worst at flat index " << worst << ": "
         << va[worst] << " vs " << vb[worst] << " (atol " << atol << ", rtol " << rtol << ")";
}

size_t expect_same_gradients(const std::vector<std::pair<std::string, Tensor>>& got,
                             const std::vector<std::pair<std::string, Tensor>>& want) {
  if (got.size() != want.size()) {
    ADD_FAILURE() << got.size() << " parameters against " << want.size();
    return 0;
  }
  size_t compared = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!want[i].second.grad().defined()) continue;
    if (!got[i].second.grad().defined()) {
      ADD_FAILURE() << got[i].first << " has no gradient";
      continue;
    }
    EXPECT_TRUE(all_close(got[i].second.grad(), want[i].second.grad(), 0, 0)) << got[i].first;
    ++compared;
  }
  return compared;
}

}  // namespace mt::testing
