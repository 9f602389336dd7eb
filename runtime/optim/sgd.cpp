#include "runtime/optim/sgd.h"

#include <cmath>

#include "runtime/kernels/optim.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::optim {

namespace {
ParamGroup with_options(ParamGroup g, const SGDOptions& o) {
  g.lr = o.lr;
  g.momentum = o.momentum;
  g.dampening = o.dampening;
  g.weight_decay = o.weight_decay;
  g.nesterov = o.nesterov;
  return g;
}

std::vector<std::string> sgd_state_names(const std::vector<ParamGroup>& groups) {
  const bool momentum = !groups.empty() && groups[0].momentum != 0.0;
  for (size_t g = 0; g < groups.size(); ++g) {
    MT_CHECK((groups[g].momentum != 0.0) == momentum, "SGD: group ", g, " has momentum ",
             groups[g].momentum, " but group 0 has ", groups[0].momentum,
             "; use one optimizer per kind (with and without momentum)");
  }
  if (momentum) return {"momentum_buffer"};
  return {};
}
}  // namespace

SGD::SGD(const std::vector<std::pair<std::string, Tensor>>& named_params, SGDOptions options)
    : SGD(std::vector<ParamGroup>{with_options(make_group(named_params), options)}) {}

SGD::SGD(const std::vector<Tensor>& params, SGDOptions options)
    : SGD(std::vector<ParamGroup>{with_options(make_group(params), options)}) {}

SGD::SGD(std::vector<ParamGroup> groups) : Optimizer("SGD", groups, sgd_state_names(groups)) {
  check_groups();
}

void SGD::validate(const ParamGroup& group, size_t index) const {
  Optimizer::validate(group, index);
  MT_CHECK(std::isfinite(group.momentum) && group.momentum >= 0, "SGD: group ", index,
           ": momentum must be >= 0, got ", group.momentum);
  MT_CHECK(std::isfinite(group.dampening), "SGD: group ", index, ": dampening must be finite");
  MT_CHECK(!group.nesterov || (group.momentum > 0 && group.dampening == 0), "SGD: group ", index,
           ": nesterov momentum requires momentum > 0 and dampening == 0");
}

std::vector<std::pair<std::string, double*>> SGD::hyperparams(ParamGroup& group) const {
  auto out = common_hyperparams(group);
  out.emplace_back("momentum", &group.momentum);
  out.emplace_back("dampening", &group.dampening);
  return out;
}

std::vector<Tensor> SGD::init_state(const ParamGroup& group, const Tensor& param) const {
  if (state_names().empty()) return {};
  // The first update copies d into the buffer; its initial value is never read.
  return {
      empty(param.shape(), TensorOptions{state_dtype_for(param.dtype()), param.device(), false})};
}

void SGD::update(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                 ParamState& state) {
  MT_CHECK(group.momentum == 0.0 || !state.tensors.empty(), "SGD: momentum ", group.momentum,
           " on a group built without momentum (the state has no momentum buffer); build the "
           "optimizer with the momentum it will use");
  const Tensor buf = group.momentum != 0.0 ? state.tensors[0] : Tensor();
  sgd_step_kernel(param.device(), param, grad, buf, group.lr, group.momentum, group.dampening,
                  group.weight_decay, group.nesterov, state.step == 1);
}

}  // namespace mt::runtime::optim
