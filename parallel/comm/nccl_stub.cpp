// The NCCL entry points of a build without CUDA: no NCCL, and a message saying so.
#include "parallel/comm/nccl_process_group.h"
#include "runtime/core/error.h"

namespace mt::parallel {

bool nccl_available() { return false; }

std::unique_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<ProcessGroup> bootstrap) {
  MT_FAIL(
      "make_nccl_process_group: this build has no NCCL (it was built without CUDA; "
      "configure with nvcc available, or use the MPI process group)");
}

}  // namespace mt::parallel
