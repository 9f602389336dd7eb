#include "runtime/autograd/node.h"

#include <atomic>

#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"

namespace mt::runtime::autograd {

namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
}

Node::Node() : sequence_nr_(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

Node::~Node() {
  std::vector<std::shared_ptr<Node>> stack;
  auto take_edges = [&stack](std::vector<Edge>& edges) {
    for (Edge& e : edges)
      if (e.node) stack.push_back(std::move(e.node));
  };
  take_edges(next_edges_);
  while (!stack.empty()) {
    std::shared_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    if (node.use_count() == 1) take_edges(node->next_edges_);  // we hold the last reference
  }  // `node` dies here with no edges left, so its destructor does not recurse
}

uint32_t Node::add_output(OutputMeta meta) {
  outputs_.push_back(std::move(meta));
  return uint32_t(outputs_.size() - 1);
}

void Node::add_grad_hook(uint32_t output_nr, GradHook hook) {
  grad_hooks_.emplace_back(output_nr, std::move(hook));
}
void Node::add_pre_hook(std::function<void(std::vector<Tensor>&)> hook) {
  pre_hooks_.push_back(std::move(hook));
}
void Node::add_post_hook(std::function<void()> hook) { post_hooks_.push_back(std::move(hook)); }

void Node::run_pre_hooks(std::vector<Tensor>& grads) {
  for (auto& [output_nr, hook] : grad_hooks_) {
    Tensor replaced = hook(grads.at(output_nr));
    if (replaced.defined()) grads[output_nr] = replaced;
  }
  for (auto& hook : pre_hooks_) hook(grads);
}

void Node::run_post_hooks() {
  for (auto& hook : post_hooks_) hook();
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {
  add_output({leaf_->shape, leaf_->dtype, leaf_->storage->device()});
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor leaf(leaf_);
  AutogradMeta& meta = leaf.autograd_meta();
  Tensor g = std::move(grads.at(0));
  for (auto& hook : meta.leaf_grad_hooks) {
    Tensor replaced = hook(g);
    if (replaced.defined()) g = replaced;
  }
  MT_CHECK(g.shape() == leaf.shape(), "backward: gradient of shape ", g.shape(),
           " for leaf '", leaf.name(), "' of shape ", leaf.shape());
  if (g.dtype() != leaf.dtype()) g = g.to(leaf.dtype());
  if (!meta.grad.defined()) {
    // Take the incoming buffer when nobody else can see it; otherwise copy.
    const bool exclusive = g.is_contiguous() && g.impl_ptr().use_count() == 1 &&
                           g.storage().use_count() == 1 && g.offset() == 0;
    meta.grad = exclusive ? g : g.clone();
  } else {
    add_(meta.grad, g);
  }
  for (auto& hook : meta.post_accumulate_hooks) hook(leaf);
  return {};
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& meta = t.autograd_meta();
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  std::shared_ptr<Node> acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}

}  // namespace mt::runtime::autograd
