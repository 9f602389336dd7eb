#include "tests/testing/gpu.h"

#include <cmath>
#include <limits>
#include <vector>

namespace mt::testing {

double relative_error(const runtime::Tensor& a, const runtime::Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  if (va.size() != vb.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) || std::isnan(vb[i])) return std::numeric_limits<double>::infinity();
    diff += (va[i] - vb[i]) * (va[i] - vb[i]);
    norm += vb[i] * vb[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

}  // namespace mt::testing
