#include "runtime/core/profiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {
namespace {

using Clock = std::chrono::steady_clock;

struct Session {
  Device device;
  Clock::time_point start;
  double wall_start_us = 0;                  // the same instant on the wall clock
  std::unique_ptr<DeviceTimeline> timeline;  // null: host times only
  std::vector<ProfiledOp> ops;
  std::vector<std::pair<int64_t, int64_t>> marks;  // per op: its begin and end marker, or -1
  int depth = 0;
  bool with_tensors = false;
};

// Touched only by the thread that opened the session (t_profiler_records_this_thread says which),
// and by start() and stop() on that thread.
Session* g_session = nullptr;
std::atomic<bool> g_recording{false};

double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

std::string device_text(Device d) {
  std::ostringstream os;
  os << d;
  return os.str();
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

}  // namespace

void Profiler::start(Device device, bool with_tensors) {
  MT_CHECK(!g_recording.exchange(true), "Profiler::start: a session is already open");
  auto session = std::make_unique<Session>();
  session->device = device;
  session->with_tensors = with_tensors;
  if (!device.is_cpu()) {
    if (DeviceRuntime* rt = device_runtime(device.type))
      session->timeline = rt->timeline(device.index);
  }
  session->start = Clock::now();
  session->wall_start_us = double(std::chrono::duration_cast<std::chrono::microseconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count());
  g_session = session.release();
  t_profiler_records_this_thread = true;
}

bool Profiler::recording() { return g_recording.load(std::memory_order_relaxed); }

int64_t Profiler::ops_recorded() {
  if (!t_profiler_records_this_thread || g_session == nullptr) return -1;
  return int64_t(g_session->ops.size());
}

int64_t Profiler::begin_op(const char* name, Device device) {
  Session& s = *g_session;
  ProfiledOp op;
  op.name = name;
  op.device = device;
  op.host_begin_us = us_since(s.start);
  const bool timed = s.timeline != nullptr && device == s.device;
  s.marks.emplace_back(timed ? s.timeline->mark() : -1, -1);  // may throw: nothing changed yet
  op.depth = s.depth++;
  s.ops.push_back(op);
  return int64_t(s.ops.size()) - 1;
}

void Profiler::end_op(int64_t index) {
  Session& s = *g_session;
  --s.depth;
  auto& [begin, end] = s.marks[size_t(index)];
  if (begin >= 0) {
    try {  // called from a destructor: a failing device leaves the op untimed, and the error
      end = s.timeline->mark();  // surfaces at the device's next call
    } catch (...) {
      begin = -1;
    }
  }
  s.ops[size_t(index)].host_end_us = us_since(s.start);
}

bool Profiler::records_tensors() { return g_session != nullptr && g_session->with_tensors; }

void Profiler::add_tensor(int64_t index, const Tensor& t, bool output) {
  if (!t.defined()) return;
  ProfiledOp& op = g_session->ops[size_t(index)];
  TensorMeta m;
  m.storage = t.storage()->id();
  for (int64_t d = 0; d < t.dim(); ++d) {
    m.shape.push_back(t.size(d));
    m.strides.push_back(t.stride(d));
  }
  m.offset = t.offset();
  m.dtype = std::string(dtype_name(t.dtype()));
  m.bytes = int64_t(t.nbytes());
  (output ? op.outputs : op.inputs).push_back(std::move(m));
}

void Profiler::add_tensor_list(int64_t index, const std::vector<Tensor>& list, bool output) {
  int64_t defined = 0;
  for (const Tensor& t : list) {
    add_tensor(index, t, output);
    defined += t.defined() ? 1 : 0;
  }
  std::string code = "V";
  code += std::to_string(defined);
  add_arg(index, std::move(code));
}

void Profiler::add_arg(int64_t index, std::string code) {
  g_session->ops[size_t(index)].args.push_back(std::move(code));
}

ProfileReport Profiler::stop() {
  MT_CHECK(recording() && t_profiler_records_this_thread,
           "Profiler::stop: no session is open on this thread");
  // The session ends here, also when reading the device's clock fails below.
  std::unique_ptr<Session> s(g_session);
  g_session = nullptr;
  t_profiler_records_this_thread = false;
  g_recording.store(false);
  ProfileReport r;
  r.device = s->device;
  if (s->timeline != nullptr) {
    const std::vector<double> at = s->timeline->resolve_us();  // waits for the device
    double first = -1, last = -1;
    for (size_t i = 0; i < s->ops.size(); ++i) {
      const auto [begin, end] = s->marks[i];
      if (begin < 0 || end < 0) continue;
      ProfiledOp& op = s->ops[i];
      op.device_begin_us = at[size_t(begin)];
      op.device_end_us = at[size_t(end)];
      if (first < 0) first = op.device_begin_us;
      last = std::max(last, op.device_end_us);
      if (op.depth == 0) r.device_busy_ms += (op.device_end_us - op.device_begin_us) / 1e3;
    }
    r.device_timed = true;
    r.device_span_ms = first < 0 ? 0 : (last - first) / 1e3;
  }
  r.wall_ms = us_since(s->start) / 1e3;
  r.wall_start_us = s->wall_start_us;
  r.ops = std::move(s->ops);
  return r;
}

std::vector<OpTotal> ProfileReport::totals() const {
  std::map<std::string, OpTotal> by_name;
  for (const ProfiledOp& op : ops) {
    if (op.depth != 0) continue;
    OpTotal& t = by_name[op.name];
    t.name = op.name;
    ++t.calls;
    t.host_ms += (op.host_end_us - op.host_begin_us) / 1e3;
    if (op.device_begin_us >= 0) t.device_ms += (op.device_end_us - op.device_begin_us) / 1e3;
  }
  std::vector<OpTotal> out;
  for (auto& [name, t] : by_name) out.push_back(std::move(t));
  const bool timed = device_timed;
  std::stable_sort(out.begin(), out.end(), [timed](const OpTotal& a, const OpTotal& b) {
    return timed ? a.device_ms > b.device_ms : a.host_ms > b.host_ms;
  });
  return out;
}

std::string ProfileReport::summary(size_t top) const {
  const std::vector<OpTotal> all = totals();
  double host_in_ops = 0;
  for (const OpTotal& t : all) host_in_ops += t.host_ms;
  char line[256];
  std::ostringstream out;
  if (device_timed) {
    std::snprintf(line, sizeof line,
                  "%.1f ms wall; on %s: %.1f ms from the first kernel to the last, %.1f ms in "
                  "kernels, %.1f ms idle between them; host: %.1f ms inside kernel calls\n",
                  wall_ms, device_text(device).c_str(), device_span_ms, device_busy_ms,
                  device_span_ms - device_busy_ms, host_in_ops);
  } else {
    std::snprintf(line, sizeof line, "%.1f ms wall; %.1f ms inside kernel calls on the host\n",
                  wall_ms, host_in_ops);
  }
  out << line;
  const double whole = device_timed ? device_busy_ms : host_in_ops;
  for (size_t i = 0; i < all.size() && i < top; ++i) {
    const OpTotal& t = all[i];
    const double ms = device_timed ? t.device_ms : t.host_ms;
    std::snprintf(line, sizeof line, "  %-40s %6lld calls %9.2f ms %5.1f%%", t.name.c_str(),
                  (long long)t.calls, ms, whole > 0 ? 100 * ms / whole : 0.0);
    out << line;
    if (device_timed) {
      std::snprintf(line, sizeof line, "  (host %.2f ms)", t.host_ms);
      out << line;
    }
    out << "\n";
  }
  if (all.size() > top) out << "  ... " << all.size() - top << " more ops in the trace\n";
  return out.str();
}

void ProfileReport::write_chrome_trace(const std::string& path,
                                       const std::vector<std::string>& extra_events) const {
  std::ofstream f(path);
  MT_CHECK(f.good(), "profiler: cannot write the trace ", path);
  // Device times are relative to the first marker: place it where its op began on the host.
  double device_offset = 0;
  for (const ProfiledOp& op : ops) {
    if (op.device_begin_us < 0) continue;
    device_offset = op.host_begin_us - op.device_begin_us;
    break;
  }
  f << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto event = [&](const ProfiledOp& op, int tid, double begin, double end) {
    char times[96];
    std::snprintf(times, sizeof times, "\"ts\": %.3f, \"dur\": %.3f", begin,
                  std::max(0.0, end - begin));
    f << (first ? "" : ",\n") << "{\"name\": " << json_string(op.name)
      << ", \"cat\": " << json_string(device_text(op.device)) << ", \"ph\": \"X\", " << times
      << ", \"pid\": 0, \"tid\": " << tid << ", \"args\": {\"depth\": " << op.depth << "}}";
    first = false;
  };
  for (const ProfiledOp& op : ops) event(op, 0, op.host_begin_us, op.host_end_us);
  for (const ProfiledOp& op : ops)
    if (op.device_begin_us >= 0)
      event(op, 1, op.device_begin_us + device_offset, op.device_end_us + device_offset);
  f << (first ? "" : ",\n")
    << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": "
       "\"host\"}}";
  if (device_timed) {
    f << ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 1, \"args\": "
         "{\"name\": "
      << json_string(device_text(device)) << "}}";
  }
  for (const std::string& e : extra_events) f << ",\n" << e;
  f << "\n]}\n";
  MT_CHECK(f.good(), "profiler: writing the trace ", path, " failed");
}

}  // namespace mt::runtime
