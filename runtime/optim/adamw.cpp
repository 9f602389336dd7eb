#include "runtime/optim/adamw.h"

#include <cmath>

#include "runtime/kernels/optim.h"

namespace mt::runtime::optim {

namespace {
ParamGroup with_options(ParamGroup g, const AdamWOptions& o) {
  g.lr = o.lr;
  g.beta1 = o.beta1;
  g.beta2 = o.beta2;
  g.eps = o.eps;
  g.weight_decay = o.weight_decay;
  return g;
}
}  // namespace

AdamW::AdamW(const std::vector<std::pair<std::string, Tensor>>& named_params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{with_options(make_group(named_params), options)}) {}

AdamW::AdamW(const std::vector<Tensor>& params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{with_options(make_group(params), options)}) {}

AdamW::AdamW(std::vector<ParamGroup> groups)
    : Optimizer("AdamW", std::move(groups), {"exp_avg", "exp_avg_sq"}) {
  check_groups();
}

void AdamW::validate(const ParamGroup& group, size_t index) const {
  Optimizer::validate(group, index);
  MT_CHECK(group.beta1 >= 0 && group.beta1 < 1, "AdamW: group ", index,
           ": beta1 must be in [0, 1), got ", group.beta1);
  MT_CHECK(group.beta2 >= 0 && group.beta2 < 1, "AdamW: group ", index,
           ": beta2 must be in [0, 1), got ", group.beta2);
  MT_CHECK(std::isfinite(group.eps) && group.eps >= 0, "AdamW: group ", index,
           ": eps must be >= 0, got ", group.eps);
}

std::vector<std::pair<std::string, double*>> AdamW::hyperparams(ParamGroup& group) const {
  auto out = common_hyperparams(group);
  out.emplace_back("beta1", &group.beta1);
  out.emplace_back("beta2", &group.beta2);
  out.emplace_back("eps", &group.eps);
  return out;
}

void AdamW::update(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                   ParamState& state) {
  adamw_step_kernel(param.device(), param, grad, state.tensors[0], state.tensors[1], group.lr,
                    group.beta1, group.beta2, group.eps, group.weight_decay, state.step);
}

void AdamW::update_group(const ParamGroup& group, std::vector<UpdateItem>& items,
                         const Tensor& grad_scale) {
  // One multi-tensor call per (device, dtype) run of parameters, in the group's order.
  std::vector<AdamWOperands> batch;
  auto flush = [&] {
    if (batch.empty()) return;
    const Device device = batch.front().param.device();
    adamw_multi_tensor_kernel(device, batch, group.lr, group.beta1, group.beta2, group.eps,
                              group.weight_decay,
                              grad_scale.defined() ? grad_scale.to(device) : grad_scale);
    batch.clear();
  };
  for (const UpdateItem& item : items) {
    if (!batch.empty() && (batch.front().param.device() != item.param.device() ||
                           batch.front().param.dtype() != item.param.dtype())) {
      flush();
    }
    batch.push_back({item.param, item.grad, item.state->tensors[0], item.state->tensors[1],
                     item.state->step});
  }
  flush();
}

}  // namespace mt::runtime::optim
