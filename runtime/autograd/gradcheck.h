// gradcheck: compares the gradients autograd computes against central finite differences.
//
//   auto r = autograd::gradcheck([](const std::vector<Tensor>& in) { return mul(in[0], in[1]); },
//                                {a, b});   // a, b: f64, requires_grad = true, any layout
//   EXPECT_TRUE(r.ok) << r.message;
//
// The output may have any shape: the check backpropagates a fixed random upstream gradient v and
// differentiates sum(fn(inputs) * v). Inputs that require grad must be f64 leaves; they may be
// non-contiguous (each element is perturbed in place through its strides), e.g.
// randn64(shape, seed, false).t().set_requires_grad(true).
//
// Then the upstream gradient is handed to the output in the layouts real losses give ops
// (broadcast: stride 0, as when the loss sums or averages the output; transposed), and each must
// give the gradients of the same values laid out contiguous.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-4;
  uint64_t seed = 1234;  // for the upstream gradient
  bool check_upstream_layouts = true;  // also broadcast and transposed upstream gradients
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatches: input, element, analytical vs numerical
};

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions options = {});

}  // namespace mt::runtime::autograd
