#include "runtime/nn/rms_norm.h"

#include "runtime/ops/factory.h"
#include "runtime/ops/rms_norm.h"

namespace mt::runtime::nn {

RMSNorm::RMSNorm(int64_t dim, double eps, TensorOptions options)
    : Module("RMSNorm"), dim_(dim), eps_(eps) {
  MT_CHECK(dim > 0, "RMSNorm: expected a positive dim, got ", dim);
  MT_CHECK(eps >= 0, "RMSNorm: expected eps >= 0, got ", eps);
  MT_CHECK(is_floating(options.dtype), "RMSNorm: expected a floating dtype, got ", options.dtype);
  weight = empty({dim}, options.with_requires_grad(false));
  register_parameter("weight", weight);
  reset_parameters(InitContext{});
}

void RMSNorm::reset_parameters(const InitContext&) { init_constant_(weight, 1.0); }

Tensor RMSNorm::operator()(const Tensor& x) {
  return call({x}, [this](const std::vector<Tensor>& in) { return rms_norm(in[0], weight, eps_); });
}

}  // namespace mt::runtime::nn
