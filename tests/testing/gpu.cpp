#include "tests/testing/gpu.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#if MT_HAVE_NCCL  // defined wherever the CUDA backend is built (parallel/CMakeLists.txt)
#include "runtime/cuda/context.h"
#endif

namespace mt::testing {

double relative_error(const runtime::Tensor& a, const runtime::Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  if (va.size() != vb.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) || std::isnan(vb[i])) return std::numeric_limits<double>::infinity();
    diff += (va[i] - vb[i]) * (va[i] - vb[i]);
    norm += vb[i] * vb[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

StreamBlocker::StreamBlocker(double release_after_s) {
  if (release_after_s > 0) {
    std::thread([released = released_, release_after_s] {
      std::this_thread::sleep_for(std::chrono::duration<double>(release_after_s));
      released->store(true);
    }).detach();
  }
#if MT_HAVE_NCCL
  // A host function on the stream that returns once released: the stream waits in it.
  auto* flag = new std::shared_ptr<std::atomic<bool>>(released_);
  const cudaError_t r = cudaLaunchHostFunc(
      runtime::cuda::current_stream(),
      [](void* data) {
        auto* released = static_cast<std::shared_ptr<std::atomic<bool>>*>(data);
        while (!(*released)->load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
        delete released;
      },
      flag);
  if (r != cudaSuccess) {
    delete flag;
    ADD_FAILURE() << "StreamBlocker: cudaLaunchHostFunc failed: " << cudaGetErrorString(r);
  }
#endif
}

}  // namespace mt::testing
