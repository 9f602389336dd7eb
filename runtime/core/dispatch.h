// Kernel dispatch: each op family declares, in runtime/kernels/<family>.h, one KernelTable per
// kernel, and each backend registers its implementation from its own file
// (runtime/cpu/<family>.cpp, later runtime/cuda/<family>.cu):
//
//   // runtime/kernels/rms_norm.h
//   inline constinit KernelTable<void(const Tensor& x, const Tensor& w, double eps, Tensor& y,
//                                     Tensor& rstd)> rms_norm_forward_kernel{"rms_norm"};
//   // runtime/cpu/rms_norm.cpp
//   MT_REGISTER_KERNEL(rms_norm_forward_kernel, DeviceType::CPU, cpu_rms_norm_forward);
//
// The table is constant-initialised (constinit), so registration from any translation unit's
// static initialiser is safe. Op code calls `table(device, args...)` and carries no #ifdef.
// Registering a kernel also registers the table's replayer under its op name (kernel_replay.h).
#pragma once

#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/core/kernel_replay.h"
#include "runtime/core/profiler.h"

namespace mt::runtime {

template <class Signature>
class KernelTable;

template <class R, class... Args>
class KernelTable<R(Args...)> {
 public:
  using Fn = R (*)(Args...);
  constexpr explicit KernelTable(const char* op) : op_(op), fns_{} {}

  void set(DeviceType device, Fn fn) { fns_[int(device)] = fn; }
  bool has(DeviceType device) const { return fns_[int(device)] != nullptr; }

  template <class... CallArgs>
  R operator()(Device device, CallArgs&&... args) const {
    Fn fn = fns_[int(device.type)];
    MT_CHECK(
        fn != nullptr, op_, ": no kernel for device ", device,
        (device.is_cuda() && !cuda_backend_built() ? " (this build has no CUDA backend)" : ""));
    if (!t_profiler_records_this_thread) [[likely]]
      return fn(std::forward<CallArgs>(args)...);
    ProfiledKernelScope recorded(op_, device);  // this thread records (runtime/core/profiler.h)
    if (Profiler::records_tensors()) (record_kernel_arg<Args>(recorded.index(), args), ...);
    return fn(std::forward<CallArgs>(args)...);
  }
  const char* op() const { return op_; }

  // Registers this table's replayer (MT_REGISTER_KERNEL does).
  void register_replay() const {
    register_kernel_replayer(
        op_, make_kernel_replayer<Args...>(
                 op_, [this](Device device, auto&... args) { (*this)(device, args...); }));
  }

 private:
  const char* op_;
  Fn fns_[kNumDeviceTypes];
};

#define MT_CONCAT_INNER(a, b) a##b
#define MT_CONCAT(a, b) MT_CONCAT_INNER(a, b)
#define MT_REGISTER_KERNEL(table, device, fn)                    \
  static const bool MT_CONCAT(mt_kernel_registered_, __LINE__) = \
      (table.set(device, fn), table.register_replay(), true)

}  // namespace mt::runtime
