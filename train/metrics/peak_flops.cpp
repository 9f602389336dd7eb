#include "train/metrics/peak_flops.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "runtime/core/error.h"

namespace mt::train {

namespace {
struct PeakEntry {
  std::string_view name_part;  // substring of the device name; the table is scanned in order
  std::string_view variant;    // a second substring that must match too ("" = any)
  double bf16;
  double f32;
};

// Dense peaks from the vendor data sheets (bf16 tensor core; fp32 non-tensor). More specific
// entries first: "H100" with "NVL" or "PCIe" before the SXM default.
constexpr PeakEntry kPeaks[] = {
    {"H200", "", 989e12, 67e12},
    {"H100", "NVL", 835e12, 60e12},
    {"H100", "PCIe", 756e12, 51e12},
    {"H100", "", 989e12, 67e12},  // SXM (e.g. "NVIDIA H100 80GB HBM3")
    {"B200", "", 2.25e15, 80e12},
    {"A100", "", 312e12, 19.5e12},
    {"L40S", "", 362e12, 91.6e12},
    {"MI300X", "", 1307e12, 163.4e12},
};
}  // namespace

std::optional<double> gpu_peak_flops(std::string_view device_name, PeakDType dtype) {
  for (const PeakEntry& e : kPeaks) {
    if (device_name.find(e.name_part) == std::string_view::npos) continue;
    if (!e.variant.empty() && device_name.find(e.variant) == std::string_view::npos) continue;
    return dtype == PeakDType::BF16 ? e.bf16 : e.f32;
  }
  return std::nullopt;
}

std::optional<double> cpu_peak_flops() {
  const char* env = std::getenv("MT_CPU_PEAK_FLOPS");
  if (env == nullptr || *env == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(env, &end);
  MT_CHECK(errno == 0 && end != env && *end == '\0' && std::isfinite(v) && v > 0,
           "MT_CPU_PEAK_FLOPS: expected a positive number of FLOP/s (e.g. 2.5e11), got '", env,
           "'");
  return v;
}

std::optional<double> peak_flops(runtime::DeviceType type, std::string_view device_name,
                                 PeakDType dtype) {
  if (type == runtime::DeviceType::CPU) return cpu_peak_flops();
  return gpu_peak_flops(device_name, dtype);
}

std::optional<double> mfu(double flops_per_token, double tokens_per_second,
                          std::optional<double> peak) {
  if (!peak || !(*peak > 0)) return std::nullopt;
  return flops_per_token * tokens_per_second / *peak;
}

}  // namespace mt::train
