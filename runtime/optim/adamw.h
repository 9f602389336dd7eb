// AdamW (decoupled weight decay; torch.optim.AdamW semantics, amsgrad off):
//   p -= lr * wd * p;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// State per parameter: exp_avg, exp_avg_sq (f32; f64 for f64 parameters) and the step t. bf16 /
// f16 parameters are updated in f32 and rounded once. One fused kernel pass per parameter.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/optim/optimizer.h"

namespace mt::runtime::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW : public Optimizer {
 public:
  // One group; named parameters key the state by FQN.
  explicit AdamW(const std::vector<std::pair<std::string, Tensor>>& named_params,
                 AdamWOptions options = {});
  explicit AdamW(const std::vector<Tensor>& params, AdamWOptions options = {});
  // Groups with their own hyper-parameters (lr, weight_decay, beta1, beta2, eps).
  explicit AdamW(std::vector<ParamGroup> groups);

 protected:
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad,
              ParamState& state) override;
  // Every parameter of the group through adamw_multi_tensor_kernel (one CUDA launch per 48),
  // which applies grad_scale as it reads the gradients.
  void update_group(const ParamGroup& group, std::vector<UpdateItem>& items,
                    const Tensor& grad_scale) override;
  std::vector<std::pair<std::string, double*>> hyperparams(ParamGroup& group) const override;
  void validate(const ParamGroup& group, size_t index) const override;
};

}  // namespace mt::runtime::optim
