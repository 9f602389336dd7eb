// Op profiler: while a session is open, every kernel that the starting thread dispatches through
// a KernelTable (runtime/core/dispatch.h) is recorded with its name, its host begin and end, and,
// on a device with a timeline (CUDA: events on the current stream), its begin and end on the
// device. The report sums the ops by name (where the time of a step goes, with the device's idle
// gaps between kernels) and writes a Chrome trace (chrome://tracing, ui.perfetto.dev).
//
// Also recorded, as ops of their own: copies between the host and a device ("copy_to_host",
// "copy_to_device"), synchronize(), and collectives (named by kind: "all_gather_into", ...; the
// whole call where it blocks the host, the time to queue it on NCCL's stream otherwise). Not
// recorded: other threads' work, and NCCL's kernels themselves (their own stream; where the
// compute stream waits for them, the wait counts as the device's idle time between ops).
// Outside a session the cost is one thread-local flag test per kernel dispatch.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/core/device.h"

namespace mt::runtime {

class Tensor;

// A kernel argument as an execution trace records it (with_tensors sessions).
struct TensorMeta {
  uint64_t storage = 0;  // Storage::id(): unique in the process, never reused
  std::vector<int64_t> shape;
  std::string dtype;     // "f32", ...
  int64_t bytes = 0;     // of this view
};

struct ProfiledOp {
  const char* name = "";  // the kernel table's op name
  Device device;
  int depth = 0;  // 0: dispatched by op code; 1 and more: from inside another kernel
  double host_begin_us = 0, host_end_us = 0;        // since the session began
  double device_begin_us = -1, device_end_us = -1;  // since the device's first marker; -1: none
  // with_tensors sessions: the kernel's tensor arguments (outputs: its non-const Tensor& ones).
  std::vector<TensorMeta> inputs, outputs;
};

struct OpTotal {
  std::string name;
  int64_t calls = 0;
  double host_ms = 0;    // host time inside the kernel calls (launch cost on a GPU)
  double device_ms = 0;  // device time between the op's markers (0 where not timed)
};

struct ProfileReport {
  std::vector<ProfiledOp> ops;  // in dispatch order
  Device device;
  double wall_ms = 0;         // session start to stop
  bool device_timed = false;  // the device had a timeline: device times are set
  double device_span_ms = 0;  // first marker to last: the device time the ops cover
  double device_busy_ms = 0;  // of which inside top-level ops (the rest: gaps between them)

  // Top-level ops summed by name, most device time (or host time, untimed) first.
  std::vector<OpTotal> totals() const;
  // A short table: the span, busy and idle device time, then the `top` largest totals.
  std::string summary(size_t top = 12) const;
  double wall_start_us = 0;   // the session's start on the wall clock (us since the epoch)

  // Chrome's trace-event JSON: host ops on thread 0, device ops on thread 1 (placed so that the
  // first marker lines up with the host time its op began), then `extra_events` (JSON objects,
  // e.g. the collectives' tracks, with times relative to wall_start_us). Throws mt::Error if it
  // cannot write.
  void write_chrome_trace(const std::string& path,
                          const std::vector<std::string>& extra_events = {}) const;
};

// The process's one recording session, from the calling thread.
class Profiler {
 public:
  // Begins recording this thread's kernels, timing those on `device` on its timeline where it
  // has one; with_tensors also records each kernel's tensor arguments (an execution trace).
  // Throws if a session is open.
  static void start(Device device, bool with_tensors = false);
  // Ends the session: waits for the device's markers and returns the report.
  static ProfileReport stop();
  static bool recording();  // a session is open (on any thread)

  // For KernelTable: record one dispatched kernel (only on the session's thread).
  static int64_t begin_op(const char* name, Device device);
  static void end_op(int64_t index);
  static bool records_tensors();  // the session was started with_tensors
  static void add_tensor(int64_t index, const Tensor& t, bool output);
};

// This thread opened the current session (the test KernelTable makes on every dispatch).
inline thread_local bool t_profiler_records_this_thread = false;

// Records one kernel argument of declared type `Declared` in a with_tensors session: Tensor and
// std::vector<Tensor> arguments, as outputs when passed by non-const reference.
template <class Declared, class Actual>
void record_kernel_arg(int64_t index, const Actual& arg) {
  using T = std::remove_cvref_t<Declared>;
  constexpr bool output = std::is_lvalue_reference_v<Declared> &&
                          !std::is_const_v<std::remove_reference_t<Declared>>;
  if constexpr (std::is_same_v<T, Tensor>) {
    Profiler::add_tensor(index, arg, output);
  } else if constexpr (std::is_same_v<T, std::vector<Tensor>>) {
    for (const Tensor& t : arg) Profiler::add_tensor(index, t, output);
  }
}

// Wraps one kernel dispatch while this thread records (KernelTable uses it).
class ProfiledKernelScope {
 public:
  ProfiledKernelScope(const char* name, Device device) : index_(Profiler::begin_op(name, device)) {}
  ~ProfiledKernelScope() { Profiler::end_op(index_); }
  int64_t index() const { return index_; }
  ProfiledKernelScope(const ProfiledKernelScope&) = delete;
  ProfiledKernelScope& operator=(const ProfiledKernelScope&) = delete;

 private:
  int64_t index_;
};

}  // namespace mt::runtime
