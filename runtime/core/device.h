// Devices a tensor can live on. CPU always; CUDA when the CUDA backend is built (a later issue
// fills it in). Kernels are registered per DeviceType (see runtime/core/dispatch.h).
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

namespace mt::runtime {

enum class DeviceType : uint8_t { CPU, CUDA };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  friend bool operator==(const Device&, const Device&) = default;
};

std::string_view device_type_name(DeviceType t);
Device device_from_name(std::string_view name);  // "cpu", "cuda", "cuda:1"
std::ostream& operator<<(std::ostream& os, Device d);

// True when this build contains the CUDA backend (whether or not a GPU is present).
bool cuda_backend_built();

}  // namespace mt::runtime
