// NcclProcessGroup: the ProcessGroup backend for CUDA tensors over NCCL.
//
// - Portable callers use nccl_available() and make_nccl_process_group(), which exist in every
//   build (the CPU-only build says it has no NCCL); the class itself exists when MT_HAVE_NCCL.
// - create(bootstrap): rank 0 makes the NCCL unique id and broadcasts it over `bootstrap` (the MPI
//   world, which is a 1-rank group in a process started without a launcher). The group drives the
//   current CUDA device (runtime::set_current_device, set by the caller before create).
//   split(color, key) makes the child communicator with ncclCommSplit (no new unique id).
// - Stream ordering: every call waits (an event) for the work already queued on the caller's
//   current stream, runs on the device's NCCL stream (staging copies and the bf16 -> f32 -> bf16
//   conversions included), and records a "done" event. Every group of a device shares that one
//   stream, so NCCL kernels of different communicators never run at once (NCCL documents that
//   concurrent communicators may deadlock) and run in program order, the same on every rank.
//   Work::wait() makes the caller's current stream wait for "done"; the host does not wait. A
//   synchronous call is such a wait at once, so later work on the compute stream sees the
//   result. A synchronous barrier() also blocks the host.
//   Every tensor a call touches is marked with cuda::record_stream for the NCCL stream.
// - Reductions: bf16/f16 accumulate in f32 (the frontend's staging, as for MPI); Avg is ncclAvg.
//   Tags of send/recv are not NCCL concepts: messages between two ranks match in issue order.
//   batch_isend_irecv runs its messages as one NCCL group (ncclGroupStart/End) with one "done"
//   event; the thread posting a batch holds the communicator until the group ends.
//   all_to_all_single does not compare split sizes across ranks (that would cost a host
//   synchronisation): mismatched splits hang until the collective timeout.
// - Timeouts: a watchdog thread per group polls the "done" events of the calls in flight; a call
//   that has not finished within collective_timeout() of its issue (or a communicator that reports
//   an asynchronous error) gets the communicator aborted (ncclCommAbort) and ends the job like the
//   MPI backend (message naming the call and the group on stderr, exit code 124; MPI_Abort when
//   MPI is running). Unlike MPI it cannot ask the other ranks where they are. NCCL calls that
//   block the host while they wait for every rank (ncclCommInitRank, ncclCommSplit, the connection
//   set-up inside a communicator's first collectives) are timed too, from when the host entered
//   them, and end the job the same way.
// - stats().seconds counts the host time to queue a call, not the time it ran on the GPU. While
//   CommTrace is on, each call is also timed on the GPU (timing events before and after it on the
//   NCCL stream, read against an anchor event whose wall-clock time the host noted, renewed every
//   10 s): its trace record holds those times (comm_trace.h, device_timed), to within the host's
//   wait for the anchor (microseconds).
#pragma once

#include <memory>

#include "parallel/comm/process_group.h"

#if MT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#endif

namespace mt::parallel {

// True when this build has the NCCL backend and a CUDA device is visible.
bool nccl_available();
// NcclProcessGroup::create where the build has NCCL; throws "this build has no NCCL" otherwise.
std::unique_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<ProcessGroup> bootstrap);

#if MT_HAVE_NCCL

class NcclProcessGroup : public ProcessGroup {
 public:
  // Collective over `bootstrap`: every member calls it; the new group has its ranks and size.
  static std::unique_ptr<NcclProcessGroup> create(std::shared_ptr<ProcessGroup> bootstrap);
  ~NcclProcessGroup() override;

  std::unique_ptr<ProcessGroup> split(int color, int key) override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool batches_messages_to_itself() const override { return true; }
  std::string name() const override { return name_; }
  runtime::DeviceType device_type() const override { return runtime::DeviceType::CUDA; }
  runtime::Device device() const override { return runtime::Device::cuda(device_); }

  // The members' ranks in the bootstrap's world (traces name groups by them): the bootstrap's
  // own list at create, and for split()'s children the parent's members of the child's color,
  // ordered by key (split gathers every member's color and key first).
  std::vector<int> world_ranks() const override { return world_ranks_; }

  cudaStream_t stream() const { return stream_; }  // the device's NCCL stream (all groups')

 protected:
  bool backend_reduces_avg() const override { return true; }
  Work dispatch(const char* collective, std::packaged_task<void()> task, bool async_op,
                const std::vector<Tensor>& tensors) override;

  void do_all_reduce(const Tensor& buf, ReduceOp op) override;
  void do_all_gather(const Tensor& out, const Tensor& in) override;
  void do_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override;
  void do_broadcast(const Tensor& buf, int root) override;
  void do_barrier() override;
  void do_all_to_all(const Tensor& out, const Tensor& in, const std::vector<int64_t>& out_counts,
                     const std::vector<int64_t>& in_counts) override;
  void do_send(const Tensor& buf, int dst, int tag) override;
  void do_recv(const Tensor& buf, int src, int tag) override;
  void begin_point_to_point_batch() override;
  void end_point_to_point_batch() override;
  std::shared_ptr<const DeviceTimes> device_times_of_running_call() const override;

 private:
  struct Event;      // a CUDA event, destroyed with the last reference
  class CallTimes;   // a traced call's timing events (DeviceTimes)
  // A call in flight, watched for its timeout.
  struct Pending {
    CollectiveRecord call;
    std::chrono::milliseconds timeout;
    std::shared_ptr<Event> done;
  };

  // An NCCL call the host is inside, watched for its timeout like the calls in flight.
  struct HostCall {
    std::string what;  // "split (ncclCommSplit, color 1)", or a collective: "all_reduce"
    bool is_collective;  // named by last_collective() when it times out (set once it runs)
    std::chrono::steady_clock::time_point entered;
    std::chrono::milliseconds timeout;
  };
  class HostCallWatch;  // RAII: host_call_ for the scope of one NCCL call

  // A batch_isend_irecv being posted: its calls share one "done" event, recorded on the NCCL
  // stream when the group ends.
  struct Batch {
    std::shared_ptr<Event> done;
    std::shared_ptr<Event> timed_end;  // while tracing: the calls' end, recorded with `done`
    std::optional<CollectiveRecord> last_call;  // watched for the batch's timeout
  };

  NcclProcessGroup(ncclComm_t comm, std::string name, std::vector<int> world_ranks);
  void check(ncclResult_t result, const char* what) const;
  void watch(Pending pending);
  void start_watchdog();  // with watch_mutex_ held
  void watchdog_loop();
  [[noreturn]] void end_job(const std::string& message);
  // The Work of a call whose completion is `done` (the caller's stream waits for it).
  static Work event_work(std::shared_ptr<Event> done);

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // recorded on the caller's stream before each call
  // One call at a time queues on the communicator; a batch holds it from begin to end (its calls
  // lock it again on the same thread).
  std::recursive_mutex call_mutex_;
  std::optional<Batch> batch_;  // guarded by call_mutex_
  std::shared_ptr<CallTimes> running_times_;  // the traced call being queued (call_mutex_)
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  std::string name_;
  std::vector<int> world_ranks_;
  Tensor barrier_buf_;  // one f32 on the device, all-reduced by barrier()

  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  std::deque<Pending> pending_;
  std::optional<HostCall> host_call_;
  bool stopping_ = false;
  std::thread watchdog_;
};

#endif  // MT_HAVE_NCCL

}  // namespace mt::parallel
