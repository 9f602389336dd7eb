// nn::Linear: y = x @ weight^T + bias, weight [out, in], bias [out] (optional), via ops linear().
//
// Default initialisation (reset_parameters) follows torch.nn.Linear: weight and bias uniform in
// [-1/sqrt(in), 1/sqrt(in)), drawn from RandomKey(seed, "<fqn>.weight" / "<fqn>.bias"). Models
// with their own scheme (torchtitan: trunc_normal std 0.02) override it in their init_weights.
// The constructor initialises with seed 0 and the module's local names, so freshly built layers
// hold identical values: call root.init_weights(seed) to key each parameter by its FQN.
#pragma once

#include <cstdint>

#include "runtime/nn/module.h"
#include "runtime/ops/float8_recipe.h"

namespace mt::runtime::nn {

class Linear : public Module {
 public:
  // options.dtype/device apply to weight and bias; options.requires_grad is ignored (parameters
  // always require grad).
  Linear(int64_t in_features, int64_t out_features, bool bias = true, TensorOptions options = {});

  Tensor operator()(const Tensor& x);
  void reset_parameters(const InitContext& ctx) override;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  bool has_bias() const { return bias.defined(); }

  Tensor weight;  // [out, in]
  Tensor bias;    // [out] or undefined

  // Float8 training: the layer's GEMMs run in FP8 (runtime/ops/float8.h). Set by
  // nn::convert_linears_to_float8 (runtime/nn/float8_conversion.h), which checks the layer can.
  bool float8 = false;
  Float8Recipe float8_recipe = Float8Recipe::Tensorwise;  // how its operands are scaled
  // Set by tensor parallelism when the layer is split: the casts' amaxes over the tp ranks, and
  // the weight dim the split cuts (0: output features, column-wise; 1: input features, row-wise).
  Float8AmaxReduce float8_amax_reduce = nullptr;
  int64_t float8_split_dim = -1;

 private:
  int64_t in_features_, out_features_;
};

}  // namespace mt::runtime::nn
