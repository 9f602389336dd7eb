// Helpers of the *_gpu_test files (on top of tests/testing/gpu.h): run one function of tensors on the CPU and on CUDA copies of
// the same inputs, and compare outputs (and gradients through autograd) with the CPU backend.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/device_runtime.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/gpu.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime::gpu_test {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_is_available()) GTEST_SKIP() << testing::cuda_skip_reason();
  }
};

// A shape as text (gtest's messages do not find runtime's operator<< for std::vector).
inline std::string str(const Shape& s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

using testing::on_cpu;
using testing::on_cuda;

inline std::vector<Tensor> to_device(const std::vector<Tensor>& in, Device d, bool grad) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) {
    Tensor c = t.detach().to(d);
    if (c.same(t)) c = t.detach();  // a fresh leaf even when no copy was needed
    if (grad && t.is_floating_point()) c.set_requires_grad(true);
    out.push_back(c);
  }
  return out;
}

// Random normal input of any floating dtype (a distinct stream per seed).
inline Tensor rnd(const Shape& shape, DType dtype = DType::F32, uint64_t seed = 1) {
  return testing::randn_as(shape, dtype, seed, "gpu_test");
}

// f on the CPU and on CUDA copies of `inputs`: outputs agree within atol + rtol * |cpu|.
inline void expect_same(const Fn& f, const std::vector<Tensor>& inputs, double atol = 1e-5,
                        double rtol = 1e-4) {
  const Tensor expected = f(to_device(inputs, Device::cpu(), false));
  const Tensor got = f(to_device(inputs, Device::cuda(), false));
  ASSERT_TRUE(got.device().is_cuda());
  EXPECT_EQ(got.dtype(), expected.dtype());
  EXPECT_TRUE(testing::all_close(on_cpu(got), expected, atol, rtol));
}

// As expect_same, bit for bit (compared through f64, NaN equal to NaN).
inline void expect_equal(const Fn& f, const std::vector<Tensor>& inputs) {
  const Tensor expected = f(to_device(inputs, Device::cpu(), false));
  const Tensor got = on_cpu(f(to_device(inputs, Device::cuda(), false)));
  ASSERT_EQ(got.shape(), expected.shape());
  EXPECT_EQ(got.dtype(), expected.dtype());
  const std::vector<double> a = got.to_vector<double>(), b = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    ASSERT_EQ(a[i], b[i]) << "element " << i << " of shape " << str(got.shape());
  }
}

// Forward as expect_same, then the gradients of sum(f(inputs) * w) (w random) w.r.t. every
// floating input agree too.
inline void expect_same_grad(const Fn& f, const std::vector<Tensor>& inputs, double atol = 1e-5,
                             double rtol = 1e-4) {
  const std::vector<Tensor> xc = to_device(inputs, Device::cpu(), true);
  const std::vector<Tensor> xg = to_device(inputs, Device::cuda(), true);
  const Tensor yc = f(xc);
  const Tensor yg = f(xg);
  EXPECT_TRUE(testing::all_close(on_cpu(yg), yc, atol, rtol));
  const Tensor w = rnd(yc.shape(), yc.dtype(), 99);
  sum(mul(yc, w)).backward();
  sum(mul(yg, on_cuda(w))).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!xc[i].requires_grad()) continue;
    if (!xc[i].grad().defined()) {  // no gradient path (e.g. a where condition)
      EXPECT_FALSE(xg[i].grad().defined()) << "input " << i;
      continue;
    }
    ASSERT_TRUE(xg[i].grad().defined()) << "input " << i;
    EXPECT_TRUE(testing::all_close(on_cpu(xg[i].grad()), xc[i].grad(), atol, rtol))
        << "gradient of input " << i;
  }
}

// Tolerances for a dtype: (atol, rtol).
inline std::pair<double, double> tol(DType t) {
  switch (t) {
    case DType::F64:
      return {1e-10, 1e-10};
    case DType::BF16:
      return {2e-2, 2e-2};
    case DType::F16:
      return {5e-3, 5e-3};
    default:
      return {2e-5, 1e-4};
  }
}

}  // namespace mt::runtime::gpu_test
