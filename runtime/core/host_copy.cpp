#include "runtime/core/host_copy.h"

#include <optional>

#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/core/profiler.h"

namespace mt::runtime {

HostCopy::HostCopy(const Tensor& t) {
  MT_CHECK(t.defined(), "HostCopy: undefined tensor");
  if (t.device().is_cpu()) {
    host_ = t.detach();
    return;
  }
  DeviceRuntime* rt = device_runtime(t.device().type);
  MT_CHECK(rt != nullptr, "HostCopy: no runtime for ", t.device());
  NoGradGuard no_grad;
  const Tensor src = t.detach().contiguous();
  host_ = Tensor::empty_pinned(src.shape(), src.dtype());
  wait_ = rt->queue_copy_to_host(src, host_);
}

Tensor HostCopy::get() {
  if (wait_) {
    std::optional<ProfiledKernelScope> recorded;  // a host wait, in the profiler's summary
    if (t_profiler_records_this_thread) recorded.emplace("host_copy_wait", Device::cpu());
    const auto wait = std::move(wait_);
    wait_ = nullptr;
    wait();
  }
  return host_;
}

}  // namespace mt::runtime
