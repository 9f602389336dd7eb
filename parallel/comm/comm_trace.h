// Per-collective records (the communication side of the profiler, and the execution trace that
// mt_replay plays back). While CommTrace is on, every collective of every process group is
// recorded when it finishes: what it was and whom it served, its group and mesh dimension, this
// rank's bytes, its tensors (dtype, shape, storage id), and its start and end on the wall clock,
// from which algbw and busbw follow by nccl-tests' definitions (bandwidth.h). An uneven
// all_to_all keeps its per-peer bytes instead of a busbw (the even formula is wrong there).
//
// Posted point-to-point messages (isend / irecv: pipeline activations, the context-parallel ring)
// run beside the caller: their record spans posting to completion (seen by Work::wait() or
// Work::is_completed()), which includes the compute they overlapped and the wait for the peer to
// post, so it carries no bandwidth. For them and for async calls, `waited_us` marks when the
// caller first waited, which is where a replay waits too.
//
// Exposed communication: the time the thread that started the trace spent blocked in
// collectives (a synchronous call from entry to return; an async one in Work::wait()). Async calls
// that finish while that thread computes cost nothing there. On a GPU (NCCL) a call only queues
// on the communication stream and Work::wait() orders streams, so this counts host time only.
//
// Device times: a backend whose calls run on a device stream (NCCL) times each traced call with
// device events around it (DeviceTimes); take() replaces the record's start_us / end_us with
// those times, waiting for the call to have run, and marks it device_timed. Its bandwidth is then
// the transfer's on the device, not the time the host took to queue it.
//
// Records are JSON lines (schema `kCommTraceSchema`, documented in docs/comm_traces.md); times
// are microseconds since the Unix epoch, so the ranks of one node line up (ranks on several nodes
// as well as their clocks agree).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "parallel/comm/bandwidth.h"

namespace mt::parallel {

// 2: posted isend / irecv records and their waited_us; 3: device_timed. Older records still read.
inline constexpr int kCommTraceSchema = 4;

// A backend's timing of one call on its device (NCCL: CUDA events around the call on the
// communication stream).
class DeviceTimes {
 public:
  virtual ~DeviceTimes() = default;
  // When the call started and ended on the device, in wall-clock microseconds since the epoch;
  // waits until it has ended. nullopt when the device could not time it (e.g. the call failed
  // before it was queued).
  virtual std::optional<std::pair<double, double>> wall_us() const = 0;
};

struct CommRecord {
  int64_t issue = 0;         // the call's place among this process's calls (issue order)
  int64_t seq = 0;           // the call's number on its group (1 = the first)
  std::string collective;    // "all_reduce", "all_gather_into", "reduce_scatter_into",
                             // "all_to_all_single", "broadcast", "barrier", "send", "recv",
                             // "isend", "irecv" (posted)
  std::string name;          // the caller's name ("fsdp.all_gather")
  std::string serves;        // what it served (ScopedCommPurpose), or ""
  std::string group;         // the group's name ("mpi:world/split(0,1)")
  std::string mesh_dim;      // the mesh dimension the group spans ("dp_shard"), or ""
  std::vector<int> members;  // world ranks of the members in group order ({} where unknown)
  int group_rank = 0, group_size = 1;
  std::string dtype;      // of the payload ("f32", "bf16", ...; "" for a barrier)
  std::string reduce_op;  // "sum", "avg", "max", "min", or "" when it does not reduce
  int peer = -1;          // broadcast: the root; send, isend: dst; recv, irecv: src
  int tag = -1;           // send, recv, isend, irecv
  std::vector<int64_t> in_shape, out_shape;     // the caller's tensors ({} where none)
  uint64_t in_storage = 0, out_storage = 0;     // their storage ids (0 where none)
  int64_t bytes_in = 0, bytes_out = 0;          // this rank's input and output bytes
  int64_t size_bytes = 0;                       // nccl-tests' size of the call (bandwidth.h)
  std::vector<int64_t> send_bytes, recv_bytes;  // all_to_all_single: to / from each member
  bool async = false;
  // isend / irecv (or, where a backend sends them so, async send / recv) posted by one
  // batch_isend_irecv: the batch's number in this process (1, 2, ...), the same for all its ops;
  // 0 when not in a batch. A replay posts them together again (NCCL: one group).
  int64_t batch = 0;
  double issued_us = 0;             // when the caller issued it (wall clock, us since the epoch)
  double start_us = 0, end_us = 0;  // when it ran (the same clock; later than issued when queued)
  double waited_us = 0;  // isend/irecv and async calls: when the caller first waited for it (0:
                         // never did, or is_completed() saw it done first)
  bool device_timed = false;  // start_us / end_us are device times (see above), not the host's
  // Not in the JSON lines: the device's timing, until take() resolves it into start/end_us.
  std::shared_ptr<const DeviceTimes> device_times;
  // Not in the JSON lines: how many kernels the profiler had recorded on the issuing (waiting)
  // thread when the call was issued (first waited for), which places it exactly among them in an
  // execution trace; -1 where the profiler was not recording on that thread.
  int64_t ops_before = -1, ops_before_wait = -1;

  double seconds() const { return (end_us - start_us) / 1e6; }
  bool has_kind() const;        // not a barrier
  CollectiveKind kind() const;  // throws for a barrier
  bool posted() const;          // an isend or irecv
  bool uneven() const;          // an all_to_all whose blocks differ between peers
  double algbw() const;         // bytes/s; 0 for a barrier, a posted message or a zero-length call
  double busbw() const;         // bytes/s; 0 where it has no meaning (uneven all_to_all, barrier,
                                // posted message)
  // All_to_all: this rank's bytes to and from the other members (its own block excluded).
  AllToAllTraffic traffic() const;
};

// A rank's trace file holds one JSON line per record (with the step it belongs to and the
// process's world rank) and one per traced step (its wall time and exposed communication).
struct TracedCollective {
  int64_t step = 0;
  int rank = 0;
  CommRecord record;
};
struct TracedStep {
  int64_t step = 0;
  int rank = 0;
  double seconds = 0, exposed_seconds = 0;
};
std::string comm_record_json(const CommRecord& r, int64_t step, int rank);
std::string comm_step_json(const TracedStep& s);
struct CommTraceLine {
  bool is_step = false;
  TracedStep step;              // when is_step
  TracedCollective collective;  // otherwise
};
// Reads a line written by either; throws mt::Error naming `where` on anything else.
CommTraceLine parse_comm_trace_line(const std::string& line, const std::string& where);

// Each rank's trace file: rank-<R><extension> (".jsonl": these records; ".json": an execution
// trace), and the rank a file name gives (nullopt for any other name).
std::string rank_file_name(int rank, std::string_view extension);
std::optional<int> rank_of_file_name(const std::string& name, std::string_view extension);

class CommTrace {
 public:
  // Starts recording (process-wide); the calling thread becomes the one whose blocked time counts
  // as exposed. Throws if a trace is on.
  static void start();
  static void stop();  // drops what was not taken
  static bool active();
  // The records finished since the last take, in issue order; device-timed ones carry their
  // device times (this waits until those calls have run on the device).
  static std::vector<CommRecord> take();
  // Seconds the tracing thread spent blocked in collectives since the last take.
  static double take_exposed_seconds();

  // For ProcessGroup: the next issue number, a finished record, and blocked time.
  static int64_t next_issue();
  static void add(CommRecord record);
  // The caller began waiting for call `issue` (an async one): sets its record's waited_us and
  // ops_before_wait, now or when the record is added.
  static void note_wait(int64_t issue, double waited_us, int64_t ops_before_wait);
  static void add_exposed(double seconds);  // ignored unless on the tracing thread
};

// Measures the time the current thread is blocked in its scope as exposed (when tracing). Scopes
// nest: only the outermost one counts.
class ExposedCommScope {
 public:
  ExposedCommScope();
  ~ExposedCommScope();
  ExposedCommScope(const ExposedCommScope&) = delete;
  ExposedCommScope& operator=(const ExposedCommScope&) = delete;

 private:
  bool entered_ = false, nested_ = false;
  double start_us_ = 0;
};

// Names what the collectives this thread issues in the scope serve ("experts of MoE layer 0");
// nests.
class ScopedCommPurpose {
 public:
  explicit ScopedCommPurpose(std::string purpose);
  ~ScopedCommPurpose();
  ScopedCommPurpose(const ScopedCommPurpose&) = delete;
  ScopedCommPurpose& operator=(const ScopedCommPurpose&) = delete;
  static const std::string& current();  // "" outside any scope

 private:
  std::string previous_;
};

double wall_clock_us();  // microseconds since the Unix epoch

}  // namespace mt::parallel
