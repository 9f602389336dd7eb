#include "runtime/nn/linear.h"

#include <cmath>

#include "runtime/ops/factory.h"
#include "runtime/ops/float8.h"
#include "runtime/ops/matmul.h"

namespace mt::runtime::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, TensorOptions options)
    : Module("Linear"), in_features_(in_features), out_features_(out_features) {
  MT_CHECK(in_features > 0 && out_features > 0,
           "Linear: expected positive sizes, got in=", in_features, " out=", out_features);
  MT_CHECK(is_floating(options.dtype), "Linear: expected a floating dtype, got ", options.dtype);
  options.requires_grad = false;
  weight = empty({out_features, in_features}, options);
  register_parameter("weight", weight);
  if (with_bias) {
    bias = empty({out_features}, options);
    register_parameter("bias", bias);
  }
  reset_parameters(InitContext{});
}

void Linear::reset_parameters(const InitContext& ctx) {
  const double bound = 1.0 / std::sqrt(double(in_features_));
  init_uniform_(weight, ctx.key("weight"), -bound, bound);
  if (bias.defined()) init_uniform_(bias, ctx.key("bias"), -bound, bound);
}

Tensor Linear::operator()(const Tensor& x) {
  MT_CHECK(x.defined() && x.dim() >= 1, "Linear: expected input [..., ", in_features_,
           "], got ", x.defined() ? "a 0-D tensor" : "an undefined tensor");
  return call({x}, [this](const std::vector<Tensor>& in) {
    // Against the weight the body uses: hooks may hand it a part of the input and of the weight
    // (tensor parallelism splits in_features).
    MT_CHECK(in[0].size(-1) == weight.size(1), "Linear: expected input [..., ", weight.size(1),
             "], got shape ", in[0].shape());
    return float8 ? float8_linear(in[0], weight, bias, float8_recipe, float8_amax_reduce,
                                   float8_split_dim)
                  : linear(in[0], weight, bias);
  });
}

}  // namespace mt::runtime::nn
