// The backward engine: walks the graph from the roots in dependency order (no recursion), sums
// gradients arriving at each node, runs leaf sinks (AccumulateGrad) as soon as they are ready and
// other nodes newest-first among the ready ones, frees each
// node's saved tensors right after it runs (unless retain_graph), and finally runs the callbacks
// queued during the walk (FSDP's end-of-backward work).
#pragma once

#include <functional>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime::autograd {

// grad_roots[i] is d(loss)/d(roots[i]); undefined means ones (for a scalar root).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots = {},
              bool retain_graph = false);

// Runs `callback` after the backward pass that is currently running finishes (the outermost one,
// when a backward runs inside another, as in activation checkpointing). Throws outside one.
void queue_callback(std::function<void()> callback);

// True while a backward pass runs on this thread.
bool in_backward();

}  // namespace mt::runtime::autograd
