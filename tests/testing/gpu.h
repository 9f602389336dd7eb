// Helpers for GPU tests (*_gpu_test.cpp): skip without a CUDA device, move tensors, and compare
// a CUDA result with the CPU's by relative error ||a - b|| / ||b|| (in f64 on the host).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "runtime/core/device_runtime.h"
#include "runtime/core/tensor.h"

namespace mt::testing {

// ||a - b||_2 / max(||b||_2, tiny), any devices and dtypes; NaN anywhere gives +inf.
double relative_error(const runtime::Tensor& a, const runtime::Tensor& b);

inline runtime::Tensor on_cuda(const runtime::Tensor& t) { return t.to(runtime::Device::cuda()); }
inline runtime::Tensor on_cpu(const runtime::Tensor& t) { return t.to(runtime::Device::cpu()); }

// Holds this thread's current CUDA stream from construction: work queued on it after this waits
// until release() (or destruction, or release_after_s seconds when that is > 0: a watchdog, so
// that code which wrongly waits for the stream fails its test rather than hang it). For tests of
// what must not wait for queued work. Needs a GPU (GPU tests skip before making one); the
// CPU-only build's does nothing.
class StreamBlocker {
 public:
  explicit StreamBlocker(double release_after_s = 0);
  ~StreamBlocker() { release(); }
  StreamBlocker(const StreamBlocker&) = delete;
  StreamBlocker& operator=(const StreamBlocker&) = delete;
  void release() { released_->store(true); }

 private:
  std::shared_ptr<std::atomic<bool>> released_ = std::make_shared<std::atomic<bool>>(false);
};

// Why a GPU test skips here (no device, or a build without the CUDA backend).
inline const char* cuda_skip_reason() {
  return ::mt::runtime::cuda_backend_built() ? "no CUDA device on this machine"
                                             : "this build has no CUDA backend (nvcc was not found)";
}

}  // namespace mt::testing

#define MT_REQUIRE_CUDA()                                                             \
  do {                                                                                \
    if (!::mt::runtime::cuda_is_available()) GTEST_SKIP() << ::mt::testing::cuda_skip_reason(); \
  } while (0)

// Expects relative_error(a, b) <= tol; more context can be streamed in (<< "...").
#define EXPECT_REL_NEAR(a, b, tol) \
  EXPECT_LE(::mt::testing::relative_error((a), (b)), (tol)) << #a " vs " #b ": "
