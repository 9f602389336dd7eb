// SGD with optional momentum, dampening, Nesterov momentum and (coupled, L2) weight decay, with
// torch.optim.SGD semantics:
//   d = g + wd * p;  buf = (first update) ? d : momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf;  p -= lr * d
// State per parameter: momentum_buffer (only when momentum != 0; f32, f64 for f64 params).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/optim/optimizer.h"

namespace mt::runtime::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  explicit SGD(const std::vector<std::pair<std::string, Tensor>>& named_params,
               SGDOptions options = {});
  explicit SGD(const std::vector<Tensor>& params, SGDOptions options = {});
  // Groups with their own hyper-parameters. The state layout (with or without a momentum
  // buffer) follows the first group's momentum; all groups must agree on momentum being zero.
  explicit SGD(std::vector<ParamGroup> groups);

 protected:
  std::vector<Tensor> init_state(const ParamGroup& group, const Tensor& param) const override;
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad,
              ParamState& state) override;
  std::vector<std::pair<std::string, double*>> hyperparams(ParamGroup& group) const override;
  void validate(const ParamGroup& group, size_t index) const override;
};

}  // namespace mt::runtime::optim
