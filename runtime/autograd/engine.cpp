#include "runtime/autograd/engine.h"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "runtime/autograd/edge_mask.h"
#include "runtime/autograd/node.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::autograd {

namespace {

thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;
thread_local uint64_t t_passes = 0;        // outermost passes started on this thread
thread_local uint64_t t_current_pass = 0;  // the running one's id (0: none)
thread_local const EdgeFilter* t_edge_filter = nullptr;

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

// One walk over (a part of) the graph: the nodes' pending gradients and dependency counts, the
// ready queue, and the nodes held alive while it runs. `follow` says which edges it walks (null:
// every valid edge).
struct Walk {
  explicit Walk(const EdgeFilter* follow) : follow(follow) {}
  bool walks(const Edge& e) const { return e.valid() && (follow == nullptr || (*follow)(e)); }

  // Counts the walked edges into every node reachable from `seeds` (explicit stack, no recursion).
  void count_dependencies(const std::vector<Node*>& seeds) {
    std::vector<Node*> stack;
    for (Node* n : seeds)
      if (state.try_emplace(n).second) stack.push_back(n);
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (const Edge& e : node->next_edges()) {
        if (!walks(e)) continue;
        auto [it, inserted] = state.try_emplace(e.node.get());
        it->second.dependencies++;
        if (inserted) stack.push_back(e.node.get());
      }
    }
  }
  // Adds a gradient for `e`'s target (without counting a dependency down).
  void deliver(const Edge& e, Tensor grad) {
    NodeState& s = state[e.node.get()];
    if (s.grads.empty()) s.grads.resize(e.node->outputs().size());
    accumulate(s.grads, e.input_nr, std::move(grad));
  }
  // Sends a node's input gradients along its walked edges; targets left without dependencies
  // become ready.
  void propagate(const Node& node, std::vector<Tensor>& input_grads) {
    const auto& edges = node.next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!walks(e)) continue;
      if (i < input_grads.size() && input_grads[i].defined()) deliver(e, std::move(input_grads[i]));
      if (--state[e.node.get()].dependencies == 0) push(e.node);
    }
  }
  void push(const std::shared_ptr<Node>& node) {
    keep_alive.emplace(node.get(), node);
    ready.push(node.get());
  }
  // Runs one node's backward under this walk's edge mask (pre-hooks first).
  std::vector<Tensor> apply(Node& node, std::vector<Tensor> grads) {
    grads.resize(node.outputs().size());
    if (std::none_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); }))
      return {};
    node.run_pre_hooks(grads);
    EdgeMaskScope mask(follow);
    return node.apply(std::move(grads));
  }

  const EdgeFilter* follow;
  std::unordered_map<Node*, NodeState> state;
  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;  // the nodes queued so far
};

// Root edges and their gradients (ones for scalar roots without one).
std::vector<std::pair<Edge, Tensor>> root_gradients(const std::vector<Tensor>& roots,
                                                    const std::vector<Tensor>& grad_roots) {
  MT_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(), "backward: ", roots.size(),
           " roots but ", grad_roots.size(), " root gradients");
  std::vector<std::pair<Edge, Tensor>> out;
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
    out.emplace_back(gradient_edge(root), g);
  }
  return out;
}

// Seeds a walk with the roots' gradients; the roots without dependencies are ready.
void seed(Walk& walk, const std::vector<std::pair<Edge, Tensor>>& root_grads) {
  std::vector<Node*> seeds;
  for (const auto& [edge, g] : root_grads) seeds.push_back(edge.node.get());
  walk.count_dependencies(seeds);
  for (const auto& [edge, g] : root_grads) {
    walk.deliver(edge, g);
    walk.keep_alive.emplace(edge.node.get(), edge.node);
  }
  for (const auto& [edge, g] : root_grads) {
    NodeState& s = walk.state[edge.node.get()];
    if (s.dependencies == 0) {
      s.dependencies = -1;  // queued
      walk.ready.push(edge.node.get());
    }
  }
}

// Callbacks belong to the outermost backward: a nested one (activation checkpointing's
// recompute) leaves them queued for the end of the whole pass.
class CallbackScope {
 public:
  CallbackScope() : outermost_(t_callbacks == nullptr) {
    if (outermost_) {
      t_callbacks = &callbacks_;
      t_current_pass = ++t_passes;
    }
  }
  ~CallbackScope() {
    if (outermost_) {
      t_callbacks = nullptr;
      t_current_pass = 0;
    }
  }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;
  bool outermost() const { return outermost_; }
  std::vector<std::function<void()>>& callbacks() { return callbacks_; }
  // Runs the callbacks (they may queue more) when this is the outermost pass.
  void run() {
    if (!outermost_) return;
    for (size_t i = 0; i < callbacks_.size(); ++i) callbacks_[i]();
  }

 private:
  bool outermost_;
  std::vector<std::function<void()>> callbacks_;
};

}  // namespace

EdgeMaskScope::EdgeMaskScope(const EdgeFilter* filter) : previous_(t_edge_filter) {
  t_edge_filter = filter;
}
EdgeMaskScope::~EdgeMaskScope() { t_edge_filter = previous_; }
bool EdgeMaskScope::passes(const Edge& edge) {
  return t_edge_filter == nullptr || (*t_edge_filter)(edge);
}

bool in_backward() { return t_callbacks != nullptr; }

uint64_t current_backward_pass() { return t_current_pass; }

void queue_callback(std::function<void()> callback) {
  MT_CHECK(t_callbacks != nullptr, "queue_callback: called outside a backward pass");
  t_callbacks->push_back(std::move(callback));
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph) {
  NoGradGuard no_grad;
  EdgeMaskScope unmasked(nullptr);  // a nested backward (recompute) sees its whole graph
  Walk walk(nullptr);
  seed(walk, root_gradients(roots, grad_roots));
  CallbackScope callbacks;
  while (!walk.ready.empty()) {
    Node* node = walk.ready.top();
    walk.ready.pop();
    std::vector<Tensor> input_grads = walk.apply(*node, std::move(walk.state[node].grads));
    if (!retain_graph) node->release_saved();
    node->run_post_hooks();
    walk.propagate(*node, input_grads);
  }
  callbacks.run();
}

// ---- the split backward ----------------------------------------------------------------------

struct DeferredBackward::State {
  // The nodes on the inputs' paths: the input pass walks edges into them only.
  std::unordered_set<const Node*> input_side;
  EdgeFilter to_input_side, to_weight_side;
  // Nodes with edges to the weight side, with the gradients that reached them, in the order the
  // input pass ran them.
  std::vector<std::pair<std::shared_ptr<Node>, std::vector<Tensor>>> pending;
  // Every node the input pass ran (post hooks and saved tensors wait for the weight pass).
  std::vector<std::shared_ptr<Node>> ran;
  std::vector<std::function<void()>> callbacks;
};

DeferredBackward::DeferredBackward() = default;
DeferredBackward::~DeferredBackward() = default;
DeferredBackward::DeferredBackward(DeferredBackward&&) noexcept = default;
DeferredBackward& DeferredBackward::operator=(DeferredBackward&&) noexcept = default;
bool DeferredBackward::empty() const { return !state_ || state_->ran.empty(); }

namespace {

// The nodes reachable from `seeds` from which a node of `targets` is reachable (targets
// included): a depth-first walk with an explicit stack; the graph is acyclic, so a node's children
// are all finished when it is.
std::unordered_set<const Node*> nodes_reaching(const std::vector<Node*>& seeds,
                                               const std::unordered_set<const Node*>& targets) {
  std::unordered_map<const Node*, bool> reaches;  // finished nodes
  std::unordered_set<const Node*> started;
  std::vector<std::pair<Node*, size_t>> stack;  // node, next edge to visit
  for (Node* s : seeds) {
    if (!started.insert(s).second) continue;
    stack.emplace_back(s, 0);
    while (!stack.empty()) {
      Node* node = stack.back().first;
      const size_t next = stack.back().second++;
      const auto& edges = node->next_edges();
      if (next < edges.size()) {
        Node* child = edges[next].node.get();
        if (child != nullptr && started.insert(child).second) stack.emplace_back(child, 0);
        continue;
      }
      bool r = targets.count(node) > 0;
      for (const Edge& e : edges) r = r || (e.valid() && reaches.at(e.node.get()));
      reaches[node] = r;
      stack.pop_back();
    }
  }
  std::unordered_set<const Node*> out;
  for (const auto& [node, r] : reaches)
    if (r) out.insert(node);
  return out;
}

}  // namespace

DeferredBackward backward_input(const std::vector<Tensor>& roots,
                                const std::vector<Tensor>& grad_roots,
                                const std::vector<Tensor>& inputs) {
  NoGradGuard no_grad;
  const auto root_grads = root_gradients(roots, grad_roots);
  DeferredBackward deferred;
  deferred.state_ = std::make_unique<DeferredBackward::State>();
  DeferredBackward::State& st = *deferred.state_;
  std::unordered_set<const Node*> targets;
  for (const Tensor& input : inputs) {
    MT_CHECK(input.requires_grad() && gradient_edge(input).node->is_leaf_sink(),
             "backward_input: the inputs must be leaves that require grad");
    targets.insert(gradient_edge(input).node.get());
  }
  std::vector<Node*> seeds;
  for (const auto& [edge, g] : root_grads) seeds.push_back(edge.node.get());
  st.input_side = nodes_reaching(seeds, targets);
  const auto* side = &st.input_side;
  st.to_input_side = [side](const Edge& e) { return side->count(e.node.get()) > 0; };
  st.to_weight_side = [side](const Edge& e) { return side->count(e.node.get()) == 0; };

  Walk walk(&st.to_input_side);
  std::vector<std::pair<Edge, Tensor>> input_side_roots;
  for (const auto& rg : root_grads) {
    if (st.input_side.count(rg.first.node.get())) {
      input_side_roots.push_back(rg);
    } else {  // a root the inputs do not depend on: all of it is weight work
      st.pending.push_back({rg.first.node, {}});
      st.pending.back().second.resize(rg.first.node->outputs().size());
      accumulate(st.pending.back().second, rg.first.input_nr, rg.second);
    }
  }
  seed(walk, input_side_roots);
  CallbackScope callbacks;
  while (!walk.ready.empty()) {
    Node* node = walk.ready.top();
    walk.ready.pop();
    const std::shared_ptr<Node> held = walk.keep_alive.at(node);
    std::vector<Tensor> grads = std::move(walk.state[node].grads);
    const bool weight_work =
        std::any_of(node->next_edges().begin(), node->next_edges().end(),
                    [&](const Edge& e) { return e.valid() && !st.to_input_side(e); });
    if (weight_work) st.pending.push_back({held, grads});
    std::vector<Tensor> input_grads = walk.apply(*node, std::move(grads));
    if (!weight_work) node->release_saved();
    st.ran.push_back(held);
    walk.propagate(*node, input_grads);
  }
  // Callbacks queued now (FSDP's end of backward) wait for the weight pass.
  if (callbacks.outermost()) st.callbacks = std::move(callbacks.callbacks());
  return deferred;
}

void backward_weight(DeferredBackward&& deferred) {
  if (!deferred.state_) return;
  NoGradGuard no_grad;
  DeferredBackward::State& st = *deferred.state_;
  Walk walk(&st.to_weight_side);
  // The weight side's dependencies: edges from the pending nodes and within the weight side.
  std::vector<Node*> weight_seeds;
  for (const auto& [node, grads] : st.pending)
    for (const Edge& e : node->next_edges())
      if (walk.walks(e)) weight_seeds.push_back(e.node.get());
  walk.count_dependencies(weight_seeds);
  for (const auto& [node, grads] : st.pending)
    for (const Edge& e : node->next_edges())
      if (walk.walks(e)) walk.state[e.node.get()].dependencies++;
  CallbackScope callbacks;
  for (const auto& cb : st.callbacks) queue_callback(cb);
  for (auto& [node, grads] : st.pending) {
    std::vector<Tensor> input_grads = walk.apply(*node, std::move(grads));
    walk.propagate(*node, input_grads);
  }
  while (!walk.ready.empty()) {
    Node* node = walk.ready.top();
    walk.ready.pop();
    std::vector<Tensor> input_grads = walk.apply(*node, std::move(walk.state[node].grads));
    node->release_saved();
    node->run_post_hooks();
    walk.propagate(*node, input_grads);
  }
  for (const auto& node : st.ran) {
    node->release_saved();
    node->run_post_hooks();
  }
  for (const auto& [node, grads] : st.pending) {
    if (std::find(st.ran.begin(), st.ran.end(), node) == st.ran.end()) {
      node->release_saved();
      node->run_post_hooks();
    }
  }
  callbacks.run();
  deferred.state_.reset();
}

}  // namespace mt::runtime::autograd
