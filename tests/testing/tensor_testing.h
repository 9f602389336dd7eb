// Helpers for tests: random inputs and value comparisons with readable failure messages.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::testing {

using runtime::Shape;
using runtime::Tensor;

// Random normal f64 tensor keyed by (seed, name); requires_grad as given.
Tensor randn64(const Shape& shape, uint64_t seed, bool requires_grad = true,
               const std::string& name = "test");
// Random tensor of any floating dtype.
Tensor randn_as(const Shape& shape, runtime::DType dtype, uint64_t seed,
                const std::string& name = "test");

// A new leaf that requires grad, with t's values and layout (e.g. a transposed view), for
// gradcheck of non-contiguous inputs.
Tensor leaf(const Tensor& t);

// Row-major flat index <-> coordinates, for naive reference implementations in tests.
std::vector<int64_t> unravel(int64_t flat, const Shape& shape);
int64_t ravel(const std::vector<int64_t>& coords, const Shape& shape);

// Success when shapes match and |a - b| <= atol + rtol * |b| elementwise (any dtypes, compared
// in f64); otherwise a message with the worst element.
::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double atol = 1e-6,
                                     double rtol = 1e-5);

// Two models' named parameters (same order): expects each gradient of `got` bitwise equal to
// `want`'s, skipping parameters without a gradient in `want` (a failure when `got` has none, or
// the counts differ). Returns how many gradients were compared.
size_t expect_same_gradients(const std::vector<std::pair<std::string, Tensor>>& got,
                             const std::vector<std::pair<std::string, Tensor>>& want);

}  // namespace mt::testing
