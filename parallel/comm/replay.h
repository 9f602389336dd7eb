// Replaying execution traces (execution_trace.h) without the model, as PARAM's comms and
// execution-trace replays do: on the same number of ranks, every rank issues its trace's
// collectives in the recorded order, with the recorded sizes, dtypes, reduce ops and split sizes,
// on groups rebuilt from the recorded members, and times each against the recorded time. With
// compute, it also re-runs every traced kernel in its place in the order, by name, through the
// same kernel table (runtime/core/kernel_replay.h: the recorded scalar arguments, the replay's
// buffers for its tensors); a kernel that cannot be re-run (one of another device than the
// replay's, an argument type traces do not record) is reported as skipped with the reason. Replaying collectives with
// scale_bytes = K multiplies every tensor's dim 0 (and the all_to_all split sizes) by K (0-d
// tensors stay): what a K-times larger model's step would cost on this network.
//
// Tensors are named by their storage ids. With Allocation::Lazy each is created at its first use
// and freed after its last, so the replay needs the memory of the live tensors only; Pre
// allocates every one up front (what a replay without liveness would need). Every buffer starts
// with the same values either way (a constant from its storage id), so the outputs, and their
// digest, are the same.
//
// Calls are issued in issue order. Synchronous ones run at once; deferred ones (posted isend /
// irecv, and the async calls of traces that record their waits, schema 3) are issued at their
// place and waited for at their wait node, where the step first waited for them (or after the
// last node), so compute overlaps them as it did in the step; their time runs from the issue to
// the wait's return. The messages of one traced batch_isend_irecv are posted as one batch again
// (NCCL: one group; message by message, a ring pass deadlocks on its in-order streams).
// Replaying collectives alone, each synchronous call starts after a barrier on its group
// (send/recv: none), so its time is its own; with compute there are no barriers, and the
// replayed step's time compares with the traced one (ReplayResult's step times).
// Kernels run on the buffers' values (constants), not the step's: the replay measures time and
// memory, and its digest shows two replays did the same, not what the step computed.
//
// Devices: the replay runs on `world`'s device. A GPU trace (kernels on cuda, collectives over
// NCCL: trace_ran_on_gpu) replays on an NCCL world (mt_replay makes one), its buffers on that
// GPU, its kernels through their CUDA entries; a kernel of another device type is skipped, saying
// so. Times stay host times, as the trace's kernel times are (a kernel's: its launch), except
// that on a GPU the replay waits for the device where a time needs the work done: after each
// synchronous collective of a collectives-only replay, at each deferred call's completion, and at
// the step's end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/execution_trace.h"
#include "parallel/comm/process_group.h"

namespace mt::parallel {

struct ReplayOptions {
  enum class Allocation { Pre, Lazy };
  Allocation allocation = Allocation::Lazy;
  int64_t scale_bytes = 1;  // >= 1
  int64_t iterations = 1;   // the sequence is replayed this many times; the last one is timed
  bool compute = false;     // also re-run the kernels (mt_replay --all); needs scale_bytes 1
  // Async calls wait where the step waited (false: each runs synchronously where it was issued,
  // overlapping nothing: mt_replay --no-overlap; posted messages stay posted either way).
  bool overlap = true;
};

struct ReplayedCall {
  int64_t node_id = 0;  // in the trace
  std::string collective, name;
  std::vector<int> members;
  int64_t size_bytes = 0;  // nccl-tests' size as replayed (scaled)
  // Deferred calls (posted messages; async calls of schema 3 traces): from the issue to the
  // return of the wait for it; other calls: their run time.
  double recorded_us = 0, replayed_us = 0;
  bool deferred = false;
};

struct ReplayedOp {
  int64_t node_id = 0;
  std::string name;  // the kernel's
  double recorded_us = 0, replayed_us = 0;
  std::string skipped;  // why it was not re-run; empty when it was
};

struct ReplayResult {
  std::vector<ReplayedCall> calls;  // this rank's, in issue order
  std::vector<ReplayedOp> ops;      // with compute: this rank's kernels, in issue order
  int64_t peak_bytes = 0;           // the allocator's peak above what was in use before
  uint64_t digest = 0;              // of every output of every call, in order
  // From the first node's issue to the last one's end: in the trace, and in the replay (less the
  // time the replay spent on its digest).
  double recorded_step_us = 0, replayed_step_us = 0;
};

// True when any rank's trace has a kernel on a GPU or a collective over NCCL.
bool trace_ran_on_gpu(const std::vector<ExecutionTrace>& traces);

// Collective over `world`, whose size must be the traces' world size; `traces` holds one trace
// per rank (any order); this rank replays its own. Throws mt::Error naming what does not fit
// (a missing rank, a collective without its members, a size that does not scale).
ReplayResult replay_step(ProcessGroup& world, const std::vector<ExecutionTrace>& traces,
                         const ReplayOptions& options);

// Rank 0's table: per call the recorded and replayed time and the replayed busbw; then totals.
std::string replay_table(const ReplayResult& result, int64_t world_size);
// With compute: per kernel name the calls, recorded and replayed time; then each skipped kernel
// name with its count and reason.
std::string replay_ops_table(const ReplayResult& result);

}  // namespace mt::parallel
