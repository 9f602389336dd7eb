#include "runtime/core/device_runtime.h"

#include <optional>

#include "runtime/core/error.h"
#include "runtime/core/profiler.h"

namespace mt::runtime {
namespace {
DeviceRuntime* g_runtimes[kNumDeviceTypes] = {};
}

void set_device_runtime(DeviceType type, DeviceRuntime* runtime) {
  g_runtimes[int(type)] = runtime;
}
DeviceRuntime* device_runtime(DeviceType type) { return g_runtimes[int(type)]; }

int cuda_device_count() {
  DeviceRuntime* rt = device_runtime(DeviceType::CUDA);
  return rt == nullptr ? 0 : rt->device_count();
}

bool cuda_is_available() { return cuda_device_count() > 0; }

namespace {
DeviceRuntime& runtime_of(Device device) {
  DeviceRuntime* rt = device_runtime(device.type);
  MT_CHECK(rt != nullptr, "device ", device, ": ",
           cuda_backend_built() ? "the CUDA backend found no usable GPU"
                                : "this build has no CUDA backend (nvcc was not found)");
  MT_CHECK(device.index >= 0 && device.index < rt->device_count(), "device ", device,
           " does not exist: this machine has ", rt->device_count(), " ",
           device_type_name(device.type), " device(s)");
  return *rt;
}
}  // namespace

void synchronize(Device device) {
  if (device.is_cpu()) return;
  std::optional<ProfiledKernelScope> recorded;  // a host wait, in the profiler's summary
  if (t_profiler_records_this_thread) recorded.emplace("synchronize", device);
  runtime_of(device).synchronize(device.index);
}

void set_current_device(Device device) {
  if (device.is_cpu()) return;
  runtime_of(device).set_device(device.index);
}

std::string device_description(Device device) {
  if (device.is_cpu()) return "cpu";
  return detail::concat(device, " (", runtime_of(device).device_name(device.index), ")");
}

}  // namespace mt::runtime
