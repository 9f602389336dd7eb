// Bytes of the training state a rank holds: the distinct storages behind parameters, their
// gradients and the optimizer state (shared storages counted once). Used by the memory benches.
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/optim/optimizer.h"

namespace mt::bench {

inline int64_t training_state_bytes(const std::vector<runtime::Tensor>& params,
                                    const runtime::optim::Optimizer& opt) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  auto add = [&](const runtime::Tensor& t) {
    if (!t.defined() || !seen.insert(t.storage().get()).second) return;
    bytes += int64_t(t.storage()->nbytes());
  };
  for (const runtime::Tensor& p : params) {
    add(p);
    add(p.grad());
  }
  for (size_t g = 0; g < opt.param_groups().size(); ++g)
    for (size_t i = 0; i < opt.param_groups()[g].params.size(); ++i)
      for (const runtime::Tensor& t : opt.state(g, i).tensors) add(t);
  return bytes;
}

}  // namespace mt::bench
