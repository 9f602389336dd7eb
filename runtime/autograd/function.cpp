#include "runtime/autograd/function.h"

#include "runtime/autograd/edge_mask.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::autograd {

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  tensor_ = t.detach();
  version_ = t.version();
}

const Tensor& SavedTensor::get() const {
  MT_CHECK(!tensor_.defined() || tensor_.version() == version_,
           "backward: a tensor of shape ", tensor_.shape(),
           " saved for backward was modified in place after it was saved (version ", version_,
           " -> ", tensor_.version(), "); clone it before the in-place op");
  return tensor_;
}

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

std::shared_ptr<Node> record(std::string name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& outputs, BackwardFn backward) {
  auto node = std::make_shared<FunctionNode>(std::move(name), std::move(backward));
  for (const Tensor& in : inputs) node->add_next_edge(gradient_edge(in));
  for (const Tensor& out : outputs) {
    const uint32_t nr = node->add_output({out.shape(), out.dtype(), out.device()});
    AutogradMeta& meta = out.autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = nr;
  }
  return node;
}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grads) {
  MT_CHECK(fn_ != nullptr, "backward through '", name_,
           "' a second time: its saved tensors were freed; pass retain_graph=true to the first "
           "backward");
  BackwardArgs args;
  args.grads = std::move(grads);
  for (size_t i = 0; i < args.grads.size(); ++i) {
    if (!args.grads[i].defined()) {
      const OutputMeta& m = outputs()[i];
      args.grads[i] = zeros(m.shape, TensorOptions{m.dtype, m.device});
    }
  }
  args.needs_input_grad.resize(next_edges().size());
  for (size_t i = 0; i < next_edges().size(); ++i)
    args.needs_input_grad[i] = needs_input_grad(i) && EdgeMaskScope::passes(next_edges()[i]);
  std::vector<Tensor> result = fn_(args);
  MT_CHECK(result.size() == next_edges().size(), "backward of '", name_, "' returned ",
           result.size(), " gradients for ", next_edges().size(), " inputs");
  return result;
}

}  // namespace mt::runtime::autograd
