// ProcessGroup: the interface every collective in minititan goes through (MPI today, NCCL later).
//
// Conventions
// - Every call carries a `name` (for profiling); the group records calls and payload bytes per
//   name in stats(). Payload bytes: the in-place tensor (all_reduce, broadcast, send, recv), the
//   gathered `out` (all_gather_into), the full `in` (reduce_scatter_into, all_to_all_single).
//   While CommTrace is on, every call is also recorded in full (comm_trace.h); a posted isend or
//   irecv once its Work is seen complete (a Work never waited on or tested leaves no record).
// - Every call returns a Work. Synchronous by default (the Work is already complete). With
//   async_op = true the call runs on the group's communication thread (one per group, started on
//   first use; calls run in issue order, sync calls issued after an async one queue behind it) and
//   Work::wait() blocks until it finishes and rethrows its error. Tensors passed to an async call
//   must not be read or written until wait() returns.
// - Argument errors (dtype, shape, split sizes, ranks) throw mt::Error at the call site, naming
//   the collective, the group and the shapes. Non-contiguous tensors are accepted (staged through
//   a contiguous copy).
// - bf16 and f16 reductions (all_reduce, reduce_scatter_into) accumulate in f32: the frontend
//   converts to f32, reduces, and converts back with round-to-nearest-even. Avg is a sum divided by
//   size() (floating dtypes only). Bool tensors can be moved but not reduced.
// - Tensors are dim-0 row blocks: all_gather_into's `out` is the concatenation of every rank's
//   `in` along dim 0; reduce_scatter_into's `in` has size() * out.size(0) rows.
// - Timeouts: no call waits for its peers longer than collective_timeout() (process-wide, 300 s
//   by default, 0 = forever). A call that runs out of time ends the whole job (every rank) after
//   printing which collective, which group, and which ranks did not arrive; backends find those by
//   comparing every member's last_collective() (sequence numbers count the calls on a group).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/comm_trace.h"
#include "runtime/core/tensor.h"

namespace mt::parallel {

using runtime::Tensor;

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

// Handle to a (possibly running) collective. Default-constructed = already complete.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_future<void> done) : done_(std::move(done)) {}
  // A completion the backend defines (e.g. an event on a device stream: wait() then orders the
  // caller's stream after it instead of blocking the host).
  Work(std::function<void()> wait, std::function<bool()> is_completed)
      : wait_(std::move(wait)), is_completed_(std::move(is_completed)) {}
  void wait() const;  // blocks (or orders, see above); rethrows the collective's error
  bool is_completed() const;

 private:
  std::shared_future<void> done_;
  std::function<void()> wait_;
  std::function<bool()> is_completed_;
};

struct CommStats {
  std::string collective;  // e.g. "all_reduce" (of the last call with this name)
  int64_t calls = 0;
  int64_t bytes = 0;
  double seconds = 0;  // time the collectives ran (async ones overlap other work)
};

// The call a rank entered last on a group. seq counts the calls entered on the group (1 = the
// first), so ranks at the same point of the same program agree on it.
struct CollectiveRecord {
  int64_t seq = 0;
  std::string collective;  // "all_reduce", ... ("" before the first call)
  std::string name;        // the caller's name for it
  bool running = false;    // entered and not yet finished
  std::chrono::steady_clock::time_point started;
};

// How long any collective may wait for its peers before the job is ended (0 = no limit).
void set_collective_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds collective_timeout();

// Another limit for one scope, e.g. none while rank 0 prepares a dataset and the others wait.
class ScopedCollectiveTimeout {
 public:
  explicit ScopedCollectiveTimeout(std::chrono::milliseconds timeout);
  ~ScopedCollectiveTimeout();
  ScopedCollectiveTimeout(const ScopedCollectiveTimeout&) = delete;
  ScopedCollectiveTimeout& operator=(const ScopedCollectiveTimeout&) = delete;

 private:
  std::chrono::milliseconds previous_;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // e.g. "mpi:world" or "mpi:world/split(1,0)"
  // Where the tensors passed to this group's collectives must live: the device type, and this
  // rank's device of that type.
  virtual runtime::DeviceType device_type() const { return runtime::DeviceType::CPU; }
  virtual runtime::Device device() const { return {device_type(), 0}; }
  // Collective over the group: ranks passing the same color form a new group, ordered by key,
  // then by rank (color >= 0). Runs after every call issued before it.
  virtual std::unique_ptr<ProcessGroup> split(int color, int key) = 0;

  Work all_reduce(const Tensor& tensor, ReduceOp op, const std::string& name,
                  bool async_op = false);
  Work all_gather_into(const Tensor& out, const Tensor& in, const std::string& name,
                       bool async_op = false);
  Work reduce_scatter_into(const Tensor& out, const Tensor& in, ReduceOp op,
                           const std::string& name, bool async_op = false);
  Work broadcast(const Tensor& tensor, int root, const std::string& name, bool async_op = false);
  Work barrier(const std::string& name, bool async_op = false);
  // Rows along dim 0: this rank sends in_splits[j] rows to rank j and receives out_splits[j] rows
  // from rank j. Empty split vectors mean equal splits (dim 0 divisible by size()).
  Work all_to_all_single(const Tensor& out, const Tensor& in, std::vector<int64_t> out_splits,
                         std::vector<int64_t> in_splits, const std::string& name,
                         bool async_op = false);
  Work send(const Tensor& tensor, int dst, int tag, const std::string& name, bool async_op = false);
  Work recv(const Tensor& tensor, int src, int tag, const std::string& name, bool async_op = false);
  // Non-blocking point-to-point (torch.distributed.isend / irecv), for pipeline stages: posted at
  // once on the calling thread, beside (not behind) the group's queued async calls, so two ranks
  // may each send to and receive from the other in any order without deadlock. `tensor` must be
  // contiguous and stay unchanged (isend) or unread (irecv) until wait(), which blocks until the
  // message has gone (or arrived), within collective_timeout(). Messages between two ranks match
  // by tag. A backend that cannot post requests (post_send/post_recv below) runs them as
  // send/recv with async_op, on its communication thread.
  Work isend(const Tensor& tensor, int dst, int tag, const std::string& name);
  Work irecv(const Tensor& tensor, int src, int tag, const std::string& name);
  // Posts several messages together (torch.distributed.batch_isend_irecv) and returns one Work
  // per op, in order; every op is checked before any is posted. Where point-to-point runs on a
  // stream in issue order (NCCL), the batch is one group (ncclGroupStart/End): its messages
  // progress together, so messages that cross (two ranks each sending to the other) pair up
  // instead of waiting on each other. Such a backend matches messages between two ranks in issue
  // order, not by tag: the ranks must post matching batches, the messages between each pair in
  // the same order. Elsewhere (MPI) it is isend / irecv per op. Where the backend can
  // (batches_messages_to_itself), a batch may also send to this rank itself: its sends to
  // itself and receives from itself pair up in order, of equal sizes and tags.
  struct P2POp {
    enum class Kind { Send, Recv };
    Kind kind = Kind::Send;
    Tensor tensor;  // contiguous; unchanged (send) or unread (recv) until its Work completes
    int peer = -1;  // dst of a send, src of a receive
    int tag = 0;
    std::string name;
  };
  std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& ops);
  // Whether a batch_isend_irecv may hold messages to this rank itself, each with its receive in the
  // same batch (MPI posts both; an NCCL group pairs them). Not by default.
  virtual bool batches_messages_to_itself() const { return false; }

  std::map<std::string, CommStats> stats() const;  // keyed by call name
  void reset_stats();
  CollectiveRecord last_collective() const;  // thread-safe (timeout reports read it)

  // World ranks of the members in group order; {} where the backend does not know them.
  virtual std::vector<int> world_ranks() const { return {}; }
  // The mesh dimension(s) this group spans ("dp_shard"), for traces; set by DeviceMesh.
  void set_mesh_dim(std::string dims) { mesh_dim_ = std::move(dims); }
  const std::string& mesh_dim() const { return mesh_dim_; }

 protected:
  ProcessGroup() = default;
  // Backend primitives. Buffers are contiguous tensors on device_type(); reductions receive
  // f32/f64/i32/i64 only and never Avg unless backend_reduces_avg() (otherwise the frontend maps
  // Avg to Sum and divides on the host). Element counts may exceed INT_MAX: backends split
  // messages themselves.
  virtual void do_all_reduce(const Tensor& buf, ReduceOp op) = 0;
  virtual void do_all_gather(const Tensor& out, const Tensor& in) = 0;
  virtual void do_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) = 0;
  virtual void do_broadcast(const Tensor& buf, int root) = 0;
  virtual void do_barrier() = 0;
  // Splits are in elements here.
  virtual void do_all_to_all(const Tensor& out, const Tensor& in,
                             const std::vector<int64_t>& out_counts,
                             const std::vector<int64_t>& in_counts) = 0;
  virtual void do_send(const Tensor& buf, int dst, int tag) = 0;
  virtual void do_recv(const Tensor& buf, int src, int tag) = 0;
  // Posts a non-blocking send / receive of a contiguous buffer and returns its completion (wait
  // and test); nullopt: this backend cannot (the default), and isend/irecv fall back.
  virtual std::optional<Work> post_send(const Tensor& buf, int dst, int tag);
  virtual std::optional<Work> post_recv(const Tensor& buf, int src, int tag);
  // Bracket the isend / irecv calls of one batch_isend_irecv (NCCL: a group); end runs also when
  // posting an op threw. Nothing by default.
  virtual void begin_point_to_point_batch() {}
  virtual void end_point_to_point_batch() {}

  // While CommTrace is on: the device timing of the call whose task runs now on this thread (a
  // stream-ordered backend times its calls on the device); nullptr by default.
  virtual std::shared_ptr<const DeviceTimes> device_times_of_running_call() const {
    return nullptr;
  }
  // True when do_all_reduce / do_reduce_scatter take ReduceOp::Avg themselves (NCCL's ncclAvg).
  virtual bool backend_reduces_avg() const { return false; }
  // Runs one call: `task` stages the buffers, calls the do_* primitive and copies back, and keeps
  // last_collective() and stats(). `tensors` are the caller's tensors it reads or writes. This
  // default runs it on the calling thread, or on the communication thread when async_op (or when
  // async calls are queued); a stream-ordered backend overrides it to run the task on its stream.
  virtual Work dispatch(const char* collective, std::packaged_task<void()> task, bool async_op,
                        const std::vector<Tensor>& tensors);

  // Derived destructors call this first, so the thread never runs a half-destroyed backend.
  void stop_comm_thread();

 private:
  // `call` holds the caller's name and the call's size, and while CommTrace is on everything
  // else a record needs (comm_trace.h); `collective` is a literal ("all_reduce").
  Work submit(const char* collective, CommRecord call, bool async_op, std::vector<Tensor> tensors,
              std::function<void()> fn);
  // The record of a call on this group: `name` and `size_bytes` always, the rest when tracing.
  CommRecord describe_call(const std::string& name, int64_t size_bytes, const Tensor* in,
                           const Tensor* out) const;
  void comm_loop();
  // Counts a posted isend/irecv in stats() (its time is not known: it runs beside the caller)
  // and, while CommTrace is on, returns `posted` wrapped so that its completion adds `call`'s
  // record (comm_trace.h: posted messages).
  Work track_posted(const char* collective, CommRecord call, Work posted);

  mutable std::mutex stats_mutex_;  // guards stats_ and last_
  std::map<std::string, CommStats> stats_;
  CollectiveRecord last_;
  std::string mesh_dim_;

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::thread comm_thread_;
};

}  // namespace mt::parallel
