// A copy to the host that the host collects later: for values the host needs (a routing
// decision that shapes the next kernels) while the device has other work to do first.
//
//   HostCopy routing(indices);            // queued behind the work that computes indices
//   Tensor shared = shared_experts(x);    // queued after it: the device keeps busy
//   std::vector<int64_t> ids = routing.get().to_vector<int64_t>();  // waits for the copy only
//
// The constructor queues the copy on the current stream, into page-locked host memory, and
// returns without waiting; get() waits for that copy (not for the work queued after it), raises
// errors that device kernels queued before it (runtime/core/deferred_errors.h), and returns the
// host tensor (contiguous, not differentiable). A host tensor is taken as it is. Dropping a
// HostCopy before get() is safe: the page-locked block is not reused before the copy ran.
#pragma once

#include <functional>

#include "runtime/core/tensor.h"

namespace mt::runtime {

class HostCopy {
 public:
  explicit HostCopy(const Tensor& t);
  Tensor get();  // waits the first time

 private:
  Tensor host_;
  std::function<void()> wait_;  // null once waited, and for host tensors
};

}  // namespace mt::runtime
