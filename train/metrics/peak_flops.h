// Peak FLOP/s per device and model FLOPs utilisation (MFU), as torchtitan reports it.
//
// MFU = flops_per_token * tokens_per_second / peak, where flops_per_token is the model's training
// FLOPs per token (6N + attention term, from the model registry) and peak the device's dense
// (no sparsity) peak for the training compute dtype. Device names are matched like torchtitan's
// get_peak_flops: by substring of the name the driver reports ("NVIDIA H100 80GB HBM3" -> H100
// SXM). Bf16 peaks are the tensor-core dense numbers of the vendor data sheets; f32 peaks are the
// plain (non-TF32) FP32 numbers, because f32 matmuls do not use TF32 unless asked to.
// A CPU has no table entry: its peak is taken from the MT_CPU_PEAK_FLOPS environment variable
// (FLOP/s, e.g. 2.5e11) when set, else it is unknown and MFU is printed as "n/a".
#pragma once

#include <optional>
#include <string_view>

#include "runtime/core/device.h"

namespace mt::train {

enum class PeakDType { BF16, F32 };

// Peak FLOP/s of a GPU by its reported name; nullopt when the name is not in the table.
std::optional<double> gpu_peak_flops(std::string_view device_name, PeakDType dtype);

// Peak FLOP/s of a CPU: MT_CPU_PEAK_FLOPS when set (throws mt::Error when it is not a positive
// number), else nullopt. The same number is used for every dtype.
std::optional<double> cpu_peak_flops();

// Either of the above, by device type (`device_name` is only used for GPUs).
std::optional<double> peak_flops(runtime::DeviceType type, std::string_view device_name,
                                 PeakDType dtype);

// The MFU as a fraction in [0, 1] (not a percentage); nullopt when the peak is unknown.
std::optional<double> mfu(double flops_per_token, double tokens_per_second,
                          std::optional<double> peak);

}  // namespace mt::train
