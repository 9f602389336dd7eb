// Execution traces: one step of one rank, every top-level kernel and every collective in issue
// order, each with its tensors (a storage id unique in the process, shape, dtype, bytes), the
// thread it ran on and its duration. `train` writes one per rank for each profiled step with
// [profiling] execution_trace = true, to
// <dump_folder>/<save_traces_folder>/execution_trace/step_<S>/rank-<R>.json; mt_replay plays its
// collectives back (parallel/comm/replay.h). The format (schema kExecutionTraceSchema) is in
// docs/comm_traces.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/comm/comm_trace.h"
#include "runtime/core/profiler.h"

namespace mt::parallel {

// 2: op nodes carry "args" (every kernel argument's code, runtime/core/profiler.h), which a
// compute replay needs; schema 1 traces (without them) still replay their collectives.
// 3: posted isend / irecv nodes, and "wait" nodes where the caller first waited for one of them
// or for an async collective.
inline constexpr int kExecutionTraceSchema = 3;

struct TraceNode {
  // Wait: where the step first waited for a posted isend / irecv or an async collective (the
  // node `waits_for`).
  enum class Type { Op, Collective, Wait };
  Type type = Type::Op;
  int64_t id = 0;        // place in issue order (1 = first)
  std::string name;      // the kernel's name, or the collective ("all_gather_into")
  std::string thread;    // "main", or "comm <group>" for an async collective
  std::string device;    // "cpu", "cuda:0"
  double issued_us = 0;  // since the trace began
  double dur_us = 0;     // host time of the kernel call, the collective's run time (posted:
                         // from posting to completion), or the wait's blocked time
  // Ops: the kernel's tensor arguments. Outputs are those taken by non-const reference; a kernel
  // that writes into a `const Tensor& out` it is given lists that among its inputs.
  std::vector<runtime::TensorMeta> inputs, outputs;
  std::vector<std::string> args;  // ops: every argument (kernel_arg_code)
  CommRecord collective;          // collectives (and, in memory only, a wait's message)
  int64_t waits_for = 0;          // waits: the id of the isend / irecv or async collective
};

struct ExecutionTrace {
  int schema = kExecutionTraceSchema;  // as read (1: op nodes carry no args)
  int rank = 0, world_size = 1;
  int64_t step = 0;
  std::vector<TraceNode> nodes;
};

// A profiled step (a with_tensors session) and the collectives of that step (CommTrace), merged in
// issue order. Collectives issued before the session began are left out; the profiler's own
// entries for collectives are replaced by their records.
ExecutionTrace make_execution_trace(const runtime::ProfileReport& ops,
                                    const std::vector<CommRecord>& collectives, int rank,
                                    int world_size, int64_t step);

// Throw mt::Error naming the file on failure (and, reading, on anything not such a trace).
void write_execution_trace(const ExecutionTrace& trace, const std::string& path);
ExecutionTrace read_execution_trace(const std::string& path);

}  // namespace mt::parallel
