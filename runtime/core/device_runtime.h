// Services of a device backend that are not kernels: how many devices there are, waiting for a
// device's queued work, copies between host and device memory, and a clock for the profiler.
// The CPU needs none of this; the CUDA backend (runtime/cuda/) registers its DeviceRuntime when
// it is built, so code outside runtime/cuda asks these functions and never includes a CUDA
// header.
//
// Work on a device is asynchronous: kernels are queued on the device's compute stream and the
// host goes on. Reading values on the host (Tensor::to(cpu), item(), to_vector()) waits for them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/device.h"

namespace mt::runtime {

class Tensor;

// Timing markers on one device's stream (the op profiler's device clock): mark() queues a marker
// on this thread's current stream and returns its number; resolve_us() waits for every marker
// and gives each one's time since marker 0, in microseconds.
class DeviceTimeline {
 public:
  virtual ~DeviceTimeline() = default;
  virtual int64_t mark() = 0;
  virtual std::vector<double> resolve_us() = 0;
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual int device_count() const = 0;
  virtual std::string device_name(int index) const = 0;  // e.g. "NVIDIA H100 80GB HBM3"
  virtual void set_device(int index) = 0;                // this thread's current device
  virtual void synchronize(int index) = 0;               // waits for all queued work
  // Copies src into dst where one or both live on this backend's devices. Same dtype and shape,
  // both contiguous. A copy into host memory has completed when this returns; so has a copy from
  // host memory, except a non_blocking one from pinned memory (Tensor::to says more).
  virtual void copy_between_devices(const Tensor& src, const Tensor& dst, bool non_blocking) = 0;
  // Queues a copy of src (on this backend's current device) into dst (page-locked host memory),
  // both contiguous, of one dtype and shape, and returns without waiting; the function returned
  // waits for that copy only, then raises the deferred errors that have arrived
  // (runtime/core/host_copy.h is the interface to use).
  virtual std::function<void()> queue_copy_to_host(const Tensor& src, const Tensor& dst) = 0;
  // A new timeline on device `index` (null where the backend has no device clock).
  virtual std::unique_ptr<DeviceTimeline> timeline(int /*index*/) { return nullptr; }
};

void set_device_runtime(DeviceType type, DeviceRuntime* runtime);
DeviceRuntime* device_runtime(DeviceType type);  // null when the backend is not built

// Number of CUDA devices this process can use: 0 without the CUDA backend or without a GPU.
int cuda_device_count();
bool cuda_is_available();
// Waits for every queued kernel and copy on `device` (no-op on the CPU).
void synchronize(Device device);
// Makes `device` the current device of this thread (a process normally uses one GPU: its local
// rank's).
void set_current_device(Device device);
std::string device_description(Device device);  // "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)"

}  // namespace mt::runtime
