#include "runtime/autograd/engine.h"

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "runtime/autograd/node.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::autograd {

namespace {

thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;

struct NodeState {
  int dependencies = 0;
  std::vector<Tensor> grads;  // one per forward output of the node
};

// Priority order of ready nodes: leaf sinks first, then newest first.
struct ReadyOrder {
  bool operator()(const Node* a, const Node* b) const {
    if (a->is_leaf_sink() != b->is_leaf_sink()) return b->is_leaf_sink();
    return a->sequence_nr() < b->sequence_nr();
  }
};

void accumulate(std::vector<Tensor>& buffer, size_t slot, Tensor grad) {
  if (!buffer[slot].defined()) {
    buffer[slot] = std::move(grad);
  } else {
    buffer[slot] = add(buffer[slot], grad);
  }
}

}  // namespace

bool in_backward() { return t_callbacks != nullptr; }

void queue_callback(std::function<void()> callback) {
  MT_CHECK(t_callbacks != nullptr, "queue_callback: called outside a backward pass");
  t_callbacks->push_back(std::move(callback));
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph) {
  MT_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(), "backward: ", roots.size(),
           " roots but ", grad_roots.size(), " root gradients");
  NoGradGuard no_grad;

  // Root edges and their gradients.
  std::vector<std::pair<Edge, Tensor>> root_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    MT_CHECK(root.requires_grad(), "backward: root ", i, " (shape ", root.shape(),
             ") does not require grad and has no grad_fn");
    Tensor g = grad_roots.empty() ? Tensor() : grad_roots[i];
    if (!g.defined()) {
      MT_CHECK(root.numel() == 1, "backward: root ", i, " has shape ", root.shape(),
               "; a gradient is needed for non-scalar roots");
      g = ones(root.shape(), root.options());
    }
    MT_CHECK(g.shape() == root.shape(), "backward: root gradient shape ", g.shape(),
             " does not match root shape ", root.shape());
    root_grads.emplace_back(gradient_edge(root), g);
  }

  // Count dependencies with an explicit stack (no recursion).
  std::unordered_map<Node*, NodeState> state;
  std::vector<Node*> stack;
  for (auto& [edge, g] : root_grads) {
    if (state.try_emplace(edge.node.get()).second) stack.push_back(edge.node.get());
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& e : node->next_edges()) {
      if (!e.valid()) continue;
      auto [it, inserted] = state.try_emplace(e.node.get());
      it->second.dependencies++;
      if (inserted) stack.push_back(e.node.get());
    }
  }

  // Hold the root nodes alive for the walk; seed their gradient buffers.
  std::vector<std::shared_ptr<Node>> keep_alive;
  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
  for (auto& [edge, g] : root_grads) {
    NodeState& s = state[edge.node.get()];
    if (s.grads.empty()) s.grads.resize(edge.node->outputs().size());
    accumulate(s.grads, edge.input_nr, g);
    keep_alive.push_back(edge.node);
  }
  for (auto& [edge, g] : root_grads) {
    NodeState& s = state[edge.node.get()];
    if (s.dependencies == 0) {
      s.dependencies = -1;  // queued
      ready.push(edge.node.get());
    }
  }

  // Callbacks belong to the outermost backward: a nested one (activation checkpointing's
  // recompute) leaves them queued for the end of the whole pass.
  std::vector<std::function<void()>> callbacks;
  const bool outermost = t_callbacks == nullptr;
  if (outermost) t_callbacks = &callbacks;
  struct Restore {
    bool outermost;
    ~Restore() {
      if (outermost) t_callbacks = nullptr;
    }
  } restore{outermost};

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(state[node].grads);
    grads.resize(node->outputs().size());
    std::vector<Tensor> input_grads;
    if (std::any_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); })) {
      node->run_pre_hooks(grads);
      input_grads = node->apply(std::move(grads));
    }
    if (!retain_graph) node->release_saved();
    node->run_post_hooks();

    const auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid()) continue;
      NodeState& s = state[e.node.get()];
      if (i < input_grads.size() && input_grads[i].defined()) {
        if (s.grads.empty()) s.grads.resize(e.node->outputs().size());
        accumulate(s.grads, e.input_nr, std::move(input_grads[i]));
      }
      if (--s.dependencies == 0) {
        keep_alive.push_back(e.node);
        ready.push(e.node.get());
      }
    }
  }
  // Callbacks may queue more callbacks.
  if (outermost)
    for (size_t i = 0; i < callbacks.size(); ++i) callbacks[i]();
}

}  // namespace mt::runtime::autograd
