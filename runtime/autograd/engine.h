// The backward engine: walks the graph from the roots in dependency order (no recursion), sums
// gradients arriving at each node, runs leaf sinks (AccumulateGrad) as soon as they are ready and
// other nodes newest-first among the ready ones, frees each
// node's saved tensors right after it runs (unless retain_graph), and finally runs the callbacks
// queued during the walk (FSDP's end-of-backward work).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime::autograd {

// grad_roots[i] is d(loss)/d(roots[i]); undefined means ones (for a scalar root).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots = {},
              bool retain_graph = false);

// A backward split in two, for zero-bubble pipeline schedules (Qi et al., "Zero Bubble Pipeline
// Parallelism", 2023): backward_input computes only what the gradients of `inputs` (leaves that
// require grad, e.g. a pipeline stage's received activations) need, so they can be sent on at
// once; the rest of the graph (the parameters' side) waits in the DeferredBackward until
// backward_weight runs it.
// - The input pass walks the nodes on paths from the roots to the inputs. Their edges to other
//   nodes are masked (runtime/autograd/edge_mask.h): ops skip that work (a matmul computes dX,
//   not dW), and the gradients arriving at those nodes are kept, with their saved tensors.
// - The weight pass runs each such node again with only those edges, then walks on to the
//   parameters' gradient sinks. Module post-backward hooks (FSDP's) and queued callbacks of the
//   input pass run at the end of the weight pass: "after the parameters' gradients" still holds.
// - Together they accumulate what backward(roots, grad_roots) does, bitwise where an op computes
//   each input's gradient the same way alone as together (as the runtime's ops do). A graph part
//   recomputed by activation checkpointing runs whole in the input pass.
class DeferredBackward {
 public:
  DeferredBackward();
  ~DeferredBackward();
  DeferredBackward(DeferredBackward&&) noexcept;
  DeferredBackward& operator=(DeferredBackward&&) noexcept;
  bool empty() const;  // nothing left for a weight pass

 private:
  friend DeferredBackward backward_input(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                         const std::vector<Tensor>&);
  friend void backward_weight(DeferredBackward&&);
  struct State;
  std::unique_ptr<State> state_;
};

DeferredBackward backward_input(const std::vector<Tensor>& roots,
                                const std::vector<Tensor>& grad_roots,
                                const std::vector<Tensor>& inputs);
void backward_weight(DeferredBackward&& deferred);

// The outermost backward pass running on this thread: a new id for each backward() and each
// backward_input() (and for the backward_weight() that finishes one), 0 outside a pass. Hooks use
// it to pair work across a split backward whose halves run apart (FSDP's bookkeeping).
uint64_t current_backward_pass();

// Runs `callback` after the backward pass that is currently running finishes (the outermost one,
// when a backward runs inside another, as in activation checkpointing). Throws outside one.
void queue_callback(std::function<void()> callback);

// True while a backward pass runs on this thread.
bool in_backward();

}  // namespace mt::runtime::autograd
