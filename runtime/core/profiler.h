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
#include <cstdio>
#include <functional>
#include <optional>
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
  std::vector<int64_t> strides;  // in elements; empty: contiguous (traces of schema 1)
  int64_t offset = 0;            // where the view starts in its storage, in elements
  std::string dtype;             // "f32", ...
  int64_t bytes = 0;             // of this view
};

struct ProfiledOp {
  const char* name = "";  // the kernel table's op name
  Device device;
  int depth = 0;  // 0: dispatched by op code; 1 and more: from inside another kernel
  double host_begin_us = 0, host_end_us = 0;        // since the session began
  double device_begin_us = -1, device_end_us = -1;  // since the device's first marker; -1: none
  // with_tensors sessions: the kernel's tensor arguments (outputs: its non-const Tensor& ones),
  // and every argument in order as kernel_arg_code writes it (what a replay decodes).
  std::vector<TensorMeta> inputs, outputs;
  std::vector<std::string> args;
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
  double wall_start_us = 0;  // the session's start on the wall clock (us since the epoch)

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
  // On the session's thread: how many kernels it has recorded so far (all depths), which places
  // other events among them exactly (a collective issued between two kernels); elsewhere -1.
  static int64_t ops_recorded();

  // For KernelTable: record one dispatched kernel (only on the session's thread).
  static int64_t begin_op(const char* name, Device device);
  static void end_op(int64_t index);
  static bool records_tensors();  // the session was started with_tensors
  static void add_tensor(int64_t index, const Tensor& t, bool output);
  // A std::vector<Tensor> argument: its defined tensors, and its code "V<count>".
  static void add_tensor_list(int64_t index, const std::vector<Tensor>& list, bool output);
  static void add_arg(int64_t index, std::string code);
};

// This thread opened the current session (the test KernelTable makes on every dispatch).
inline thread_local bool t_profiler_records_this_thread = false;

// A kernel argument type other than Tensor and std::vector<Tensor> that holds tensors (the
// optimizers' operand lists) specialises TracedArg with
//   static void record(int64_t op_index, const T& arg);  // its tensors (Profiler::add_tensor)
//                                                        // and its code (Profiler::add_arg)
//   static T decode(Decoder& decoder, const std::string& code);  // kernel_replay.h
template <class T>
struct TracedArg;
template <class T>
concept HasTracedArg = requires(const T& arg) {
  TracedArg<T>::record(int64_t{}, arg);
};

template <class T>
struct IsStdFunction : std::false_type {};
template <class R, class... A>
struct IsStdFunction<std::function<R(A...)>> : std::true_type {};

// A kernel argument's code in a trace (ProfiledOp::args; decoded by kernel_replay.h):
//   "T" a defined tensor (the next of the op's inputs or, for a non-const Tensor&, outputs),
//   "T-" an undefined one, "V<n>" a std::vector<Tensor> of n defined tensors, "b0"/"b1" a bool,
//   "i<v>" an integer, "e<v>" an enum (its integer value), "f<v>" a floating value (17
//   significant digits: exact for f64), "o" an empty std::optional and "o<code>" a full one,
//   "L<v>,<v>,..." a std::vector<int64_t>, "F" a std::function (an error-message callback: a
//   replay passes one that returns an empty value), a TracedArg type's own code, "?" any other
//   type (a kernel with such an argument cannot be replayed).
template <class T>
std::string kernel_arg_code(const T& arg) {
  // Formatted with snprintf: GCC 12 warns falsely (-Wrestrict) on std::string concatenations
  // inlined here.
  char text[48];
  if constexpr (std::is_same_v<T, bool>) {
    return arg ? "b1" : "b0";
  } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    std::snprintf(text, sizeof text, "%c%lld", std::is_enum_v<T> ? 'e' : 'i',
                  static_cast<long long>(arg));
    return text;
  } else if constexpr (std::is_floating_point_v<T>) {
    std::snprintf(text, sizeof text, "f%.17g", double(arg));
    return text;
  } else if constexpr (requires {
                         typename T::value_type;
                         arg.has_value();
                       }) {
    std::string code(1, 'o');
    if (arg.has_value()) code.append(kernel_arg_code(*arg));
    return code;
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    std::string code(1, 'L');
    for (size_t i = 0; i < arg.size(); ++i) {
      std::snprintf(text, sizeof text, i == 0 ? "%lld" : ",%lld", static_cast<long long>(arg[i]));
      code.append(text);
    }
    return code;
  } else if constexpr (IsStdFunction<T>::value) {
    return "F";
  } else {
    return "?";
  }
}

// Records one kernel argument of declared type `Declared` in a with_tensors session: Tensor and
// std::vector<Tensor> arguments as tensors (outputs when passed by non-const reference), and
// every argument's code.
template <class Declared, class Actual>
void record_kernel_arg(int64_t index, const Actual& arg) {
  using T = std::remove_cvref_t<Declared>;
  constexpr bool output =
      std::is_lvalue_reference_v<Declared> && !std::is_const_v<std::remove_reference_t<Declared>>;
  if constexpr (std::is_same_v<T, Tensor>) {
    Profiler::add_tensor(index, arg, output);
    Profiler::add_arg(index, arg.defined() ? "T" : "T-");
  } else if constexpr (std::is_same_v<T, std::vector<Tensor>>) {
    Profiler::add_tensor_list(index, arg, output);
  } else if constexpr (HasTracedArg<T>) {
    TracedArg<T>::record(index, arg);
  } else {
    Profiler::add_arg(index, kernel_arg_code<T>(arg));
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
