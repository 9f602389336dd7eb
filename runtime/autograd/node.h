// Autograd graph nodes. Each op that records the graph creates one Node holding what its backward
// needs; the node's next edges point at the nodes that produced its inputs (or at the
// AccumulateGrad node of a leaf). See function.h for how ops create nodes and engine.h for the
// walk. First-order only: saved tensors carry no history.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;  // which of node's gradient inputs this edge feeds
  bool valid() const { return node != nullptr; }
};

// Shape/dtype/device of a forward output, to make zeros when no gradient reached it.
struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

class Node {
 public:
  Node();
  // Tears down the nodes only this one keeps alive iteratively: a long graph must not overflow
  // the stack through nested shared_ptr destructors.
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual std::string name() const = 0;
  // grads[i] is the gradient w.r.t. forward output i (zeros where none flowed). Returns one
  // gradient per next edge (undefined where that input needs none).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  // Drops saved tensors after backward (unless the graph is retained).
  virtual void release_saved() {}

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  void add_next_edge(Edge edge) { next_edges_.push_back(std::move(edge)); }
  const std::vector<OutputMeta>& outputs() const { return outputs_; }
  uint32_t add_output(OutputMeta meta);
  bool needs_input_grad(size_t i) const { return i < next_edges_.size() && next_edges_[i].valid(); }
  // Creation order: the engine runs later-created nodes first among those ready.
  uint64_t sequence_nr() const { return sequence_nr_; }
  // Leaf sinks run as soon as they are ready, so a leaf's .grad is complete before any node
  // created after it runs (FSDP relies on this in its post-backward hooks).
  virtual bool is_leaf_sink() const { return false; }

  // Hooks on the gradient of forward output `output_nr` (tensor.register_hook on a non-leaf).
  void add_grad_hook(uint32_t output_nr, GradHook hook);
  // Runs before apply with all incoming gradients (module pre-backward hooks).
  void add_pre_hook(std::function<void(std::vector<Tensor>& grads)> hook);
  // Runs after apply (module post-backward hooks).
  void add_post_hook(std::function<void()> hook);

  void run_pre_hooks(std::vector<Tensor>& grads);
  void run_post_hooks();

 private:
  std::vector<Edge> next_edges_;
  std::vector<OutputMeta> outputs_;
  uint64_t sequence_nr_;
  std::vector<std::pair<uint32_t, GradHook>> grad_hooks_;
  std::vector<std::function<void(std::vector<Tensor>&)>> pre_hooks_;
  std::vector<std::function<void()>> post_hooks_;
};

// Sink for a leaf's gradient: applies the leaf's hooks, accumulates into .grad, then runs the
// post-accumulate hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::string name() const override { return "AccumulateGrad"; }
  bool is_leaf_sink() const override { return true; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// The edge a gradient for `t` should flow along: its grad_fn, its AccumulateGrad (leaves that
// require grad), or an invalid edge.
Edge gradient_edge(const Tensor& t);

}  // namespace mt::runtime::autograd
