// The CUDA backend's per-process state: the compute stream every kernel of the runtime is queued
// on, library handles (cuBLASLt, cuDNN) and their workspaces, and device properties.
//
// Conventions
// - A process drives one GPU (its local rank's); runtime::set_current_device picks it. Tensors on
//   another device are an error at the kernel, not a silent cross-device access.
// - Every kernel and library call goes on current_stream(). Other streams (NCCL's, FSDP's
//   all-gather and reduce-scatter streams) order themselves against it with events, and memory
//   they touch is marked with record_stream() so the caching allocator does not reuse it early.
// - Only .cu files and CUDA-aware code (runtime/cuda, parallel's NCCL backend) include this.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/core/tensor.h"
#include "runtime/cuda/cuda_check.h"

namespace mt::runtime::cuda {

int device_count();  // 0 when there is no GPU or no usable driver
int current_device();
const cudaDeviceProp& device_properties(int device);

// The stream the runtime queues work on for this thread (the device's compute stream unless a
// StreamGuard says otherwise).
cudaStream_t current_stream();
// The device's compute stream (created non-blocking on first use).
cudaStream_t compute_stream(int device);

// Runs the runtime's work of its scope on `stream` (e.g. a side stream for copies).
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t previous_;
  bool previous_active_;
};

cublasLtHandle_t cublaslt_handle();
// The device's classic cuBLAS handle, bound to current_stream() and to workspace() (for calls
// whose shapes change every step, such as grouped_mm's, where cuBLASLt's cached plans would not
// be reused).
inline constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
cublasHandle_t cublas_handle();
// A device buffer of at least `bytes` for library workspaces, reused across calls on the
// compute stream (grows, never shrinks). One buffer per device: library calls that use it must
// run on the compute stream (side streams carry copies and collectives, not GEMMs).
void* workspace(size_t bytes);

// Throws when `t` is not on the current CUDA device (kernels cannot read other devices' memory).
void check_on_current_device(const Tensor& t, const char* op);

// Launch geometry for one thread per element: blocks of kThreads, grid capped for grid-stride.
inline constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > (int64_t(1) << 20) ? (int64_t(1) << 20) : b));
}

}  // namespace mt::runtime::cuda
