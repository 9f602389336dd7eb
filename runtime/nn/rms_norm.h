// nn::RMSNorm (Llama): y = x * rsqrt(mean(x^2, last dim) + eps) * weight, via ops rms_norm().
// weight [dim] is initialised to ones (reset_parameters ignores the key: nothing is random).
#pragma once

#include <cstdint>

#include "runtime/nn/module.h"

namespace mt::runtime::nn {

class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6, TensorOptions options = {});

  Tensor operator()(const Tensor& x);
  void reset_parameters(const InitContext& ctx) override;

  int64_t dim() const { return dim_; }
  double eps() const { return eps_; }

  Tensor weight;  // [dim]

 private:
  int64_t dim_;
  double eps_;
};

}  // namespace mt::runtime::nn
