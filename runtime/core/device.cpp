#include "runtime/core/device.h"

#include <charconv>

#include "runtime/core/error.h"

namespace mt::runtime {

std::string_view device_type_name(DeviceType t) { return t == DeviceType::CPU ? "cpu" : "cuda"; }

Device device_from_name(std::string_view name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda") return Device::cuda(0);
  if (name.starts_with("cuda:")) {
    int index = -1;
    auto rest = name.substr(5);
    auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), index);
    if (ec == std::errc() && ptr == rest.data() + rest.size() && index >= 0)
      return Device::cuda(index);
  }
  MT_FAIL("unknown device '", name, "'; valid: cpu, cuda, cuda:N");
}

std::ostream& operator<<(std::ostream& os, Device d) {
  os << device_type_name(d.type);
  if (d.is_cuda()) os << ":" << d.index;
  return os;
}

bool cuda_backend_built() {
#ifdef MT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace mt::runtime
