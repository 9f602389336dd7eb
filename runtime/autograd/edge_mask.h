// The engine's edge mask (engine.h, split backward): while a mask is set on this thread, an op's
// backward sees BackwardArgs::needs(i) false for the edges the mask leaves out, so it skips their
// work (a matmul with its weight edge masked computes dX but not dW). Edges of nodes the mask
// does not know pass. Internal to runtime/autograd.
#pragma once

#include <functional>

#include "runtime/autograd/node.h"

namespace mt::runtime::autograd {

using EdgeFilter = std::function<bool(const Edge& edge)>;

class EdgeMaskScope {
 public:
  // A null filter: no mask (every edge passes) within this scope.
  explicit EdgeMaskScope(const EdgeFilter* filter);
  ~EdgeMaskScope();
  EdgeMaskScope(const EdgeMaskScope&) = delete;
  EdgeMaskScope& operator=(const EdgeMaskScope&) = delete;
  // Whether `edge` passes the mask set on this thread.
  static bool passes(const Edge& edge);

 private:
  const EdgeFilter* previous_;
};

}  // namespace mt::runtime::autograd
