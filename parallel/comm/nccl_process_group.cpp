// NCCL backend: communicator set-up and split, stream ordering of each call, the NCCL calls
// behind the collectives, and the watchdog that ends the job when a call runs out of time.
#include "parallel/comm/nccl_process_group.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <mutex>

#include "parallel/comm/host_deadline.h"
#include "parallel/comm/timeout_report.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/context.h"
#include "runtime/ops/factory.h"

namespace mt::parallel {

namespace cuda = runtime::cuda;
using runtime::Device;
using runtime::DType;

namespace {

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::BF16:
      return ncclBfloat16;  // moved, never reduced (the frontend upcasts)
    case DType::F16:
      return ncclFloat16;
    case DType::Bool:
      return ncclUint8;
  }
  MT_FAIL("NcclProcessGroup: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  MT_FAIL("NcclProcessGroup: unknown reduce op");
}

char* bytes_of(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

std::string nccl_error(ncclResult_t result, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return detail::concat(ncclGetErrorString(result),
                        last != nullptr && *last != '\0' ? detail::concat(" (", last, ")") : "");
}

// The NCCL stream of `device`, one per device for every group (created once, never destroyed):
// NCCL kernels of different communicators never run at the same time (NCCL's documentation says
// concurrent communicators may deadlock: an HSDP replicate all-reduce beside a shard all-gather,
// an expert all-to-all beside FSDP's prefetch), and they run in the order the program issues
// them, which is the same on every rank.
cudaStream_t shared_nccl_stream(int device) {
  static std::mutex mutex;
  static std::map<int, cudaStream_t> streams;
  std::lock_guard lock(mutex);
  cudaStream_t& s = streams[device];
  if (s == nullptr) MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

// A device event whose wall-clock time the host noted (it waited for the event, then read the
// clock): timing events of the same device are read against it. Renewed when older than 10 s
// where the host reads calls' times (it waits for the device there anyway), so the float
// milliseconds of cudaEventElapsedTime stay near a microsecond and the two clocks cannot drift
// far apart, and the path that issues calls never waits for one (except for the first).
struct Anchor {
  cudaEvent_t event = nullptr;
  double wall_us = 0;
  std::chrono::steady_clock::time_point taken;
  Anchor() = default;
  Anchor(const Anchor&) = delete;
  Anchor& operator=(const Anchor&) = delete;
  ~Anchor() { (void)cudaEventDestroy(event); }
};

// The current anchor of `device`, taken now when it has none (fresh_if_older_than: also when
// older): an event on an idle stream of its own, waited for.
std::shared_ptr<const Anchor> anchor_for(
    int device, std::chrono::steady_clock::duration fresh_if_older_than =
                    std::chrono::steady_clock::duration::max()) {
  static std::mutex mutex;
  static std::map<int, std::shared_ptr<const Anchor>> anchors;
  static std::map<int, cudaStream_t> streams;  // idle streams: their events complete at once
  std::lock_guard lock(mutex);
  std::shared_ptr<const Anchor>& anchor = anchors[device];
  const auto now = std::chrono::steady_clock::now();
  if (anchor && now - anchor->taken < fresh_if_older_than) return anchor;
  cudaStream_t& stream = streams[device];
  if (stream == nullptr) MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto fresh = std::make_shared<Anchor>();
  MT_CUDA_CHECK(cudaEventCreate(&fresh->event));
  MT_CUDA_CHECK(cudaEventRecord(fresh->event, stream));
  MT_CUDA_CHECK(cudaEventSynchronize(fresh->event));
  fresh->wall_us = wall_clock_us();
  fresh->taken = now;
  anchor = fresh;
  return anchor;
}

}  // namespace

struct NcclProcessGroup::Event {
  cudaEvent_t event = nullptr;
  explicit Event(bool timing = false) {
    MT_CUDA_CHECK(
        cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() { (void)cudaEventDestroy(event); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  // cudaSuccess when the work before it has run, cudaErrorNotReady while it runs, else an error.
  cudaError_t status() const {
    const cudaError_t s = cudaEventQuery(event);
    // NotReady is also left as this thread's last error, where the next kernel launch check
    // (MT_CUDA_CHECK_LAUNCH reads cudaGetLastError) would report it as a failure: clear it.
    if (s == cudaErrorNotReady) (void)cudaGetLastError();
    return s;
  }
};

class NcclProcessGroup::CallTimes : public DeviceTimes {
 public:
  CallTimes(int device, std::shared_ptr<Event> start, std::shared_ptr<Event> end)
      : device_(device), anchor_(anchor_for(device)), start_(std::move(start)),
        end_(std::move(end)) {}

  std::optional<std::pair<double, double>> wall_us() const override {
    float to_start = 0, to_end = 0;
    // An end never recorded (the call failed before it was queued) fails the elapsed time.
    if (cudaEventSynchronize(end_->event) != cudaSuccess ||
        cudaEventElapsedTime(&to_start, anchor_->event, start_->event) != cudaSuccess ||
        cudaEventElapsedTime(&to_end, anchor_->event, end_->event) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it for the next launch check
      return std::nullopt;
    }
    (void)anchor_for(device_, std::chrono::seconds(10));  // for the calls issued from now on
    return std::pair{anchor_->wall_us + 1e3 * double(to_start),
                     anchor_->wall_us + 1e3 * double(to_end)};
  }

 private:
  int device_;
  std::shared_ptr<const Anchor> anchor_;
  std::shared_ptr<Event> start_, end_;
};

class NcclProcessGroup::HostCallWatch {
 public:
  HostCallWatch(NcclProcessGroup& group, std::string what, bool is_collective)
      : group_(group) {
    {
      std::lock_guard lock(group_.watch_mutex_);
      group_.start_watchdog();
      group_.host_call_ = HostCall{std::move(what), is_collective,
                                   std::chrono::steady_clock::now(), collective_timeout()};
    }
    group_.watch_cv_.notify_one();
  }
  ~HostCallWatch() {
    std::lock_guard lock(group_.watch_mutex_);
    group_.host_call_.reset();
  }
  HostCallWatch(const HostCallWatch&) = delete;
  HostCallWatch& operator=(const HostCallWatch&) = delete;

 private:
  NcclProcessGroup& group_;
};

bool nccl_available() { return runtime::cuda_is_available(); }

std::unique_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<ProcessGroup> bootstrap) {
  return NcclProcessGroup::create(std::move(bootstrap));
}

std::unique_ptr<NcclProcessGroup> NcclProcessGroup::create(
    std::shared_ptr<ProcessGroup> bootstrap) {
  MT_CHECK(bootstrap != nullptr, "NcclProcessGroup::create: no bootstrap group");
  MT_CHECK(runtime::cuda_is_available(), "NcclProcessGroup::create on group ", bootstrap->name(),
           ": no CUDA device is visible");
  // The unique id travels as int64 words over the bootstrap group (on its device).
  ncclUniqueId id{};
  static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0);
  const int64_t words = int64_t(sizeof id / sizeof(int64_t));
  Tensor host = Tensor::empty({words}, {DType::I64});
  std::memset(host.data_ptr(), 0, sizeof id);
  if (bootstrap->rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    MT_CHECK(r == ncclSuccess,
             "NcclProcessGroup::create: ncclGetUniqueId failed: ", nccl_error(r, nullptr));
    std::memcpy(host.data_ptr(), &id, sizeof id);
  }
  const Device where = bootstrap->device_type() == runtime::DeviceType::CUDA
                           ? Device::cuda(cuda::current_device())
                           : Device::cpu();
  Tensor buf = host.to(where);
  bootstrap->broadcast(buf, 0, "nccl_unique_id");
  std::memcpy(&id, buf.to(Device::cpu()).contiguous().data_ptr(), sizeof id);

  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclSuccess;
  {
    // It blocks the host until every rank has joined: a missing rank ends the job in time.
    HostDeadline deadline(collective_timeout(), bootstrap->rank(),
                          detail::concat("ncclCommInitRank over group ", bootstrap->name(),
                                         " (rank ", bootstrap->rank(), " of ", bootstrap->size(),
                                         ")"));
    r = ncclCommInitRank(&comm, bootstrap->size(), id, bootstrap->rank());
  }
  MT_CHECK(r == ncclSuccess, "NcclProcessGroup::create over group ", bootstrap->name(), " (rank ",
           bootstrap->rank(), " of ", bootstrap->size(),
           "): ncclCommInitRank failed: ", nccl_error(r, comm));
  return std::unique_ptr<NcclProcessGroup>(new NcclProcessGroup(
      comm, detail::concat("nccl:", bootstrap->name()), bootstrap->world_ranks()));
}

NcclProcessGroup::NcclProcessGroup(ncclComm_t comm, std::string name, std::vector<int> world_ranks)
    : comm_(comm), name_(std::move(name)), world_ranks_(std::move(world_ranks)) {
  try {
    device_ = cuda::current_device();
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    stream_ = shared_nccl_stream(device_);
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    cuda::StreamGuard guard(stream_);  // the buffer lives on the NCCL stream
    barrier_buf_ = Tensor::empty({1}, runtime::TensorOptions{}.with_device(Device::cuda(device_)));
    barrier_buf_.fill_(0.0);
  } catch (...) {
    if (ready_ != nullptr) (void)cudaEventDestroy(ready_);
    (void)ncclCommDestroy(comm_);
    throw;
  }
}

NcclProcessGroup::~NcclProcessGroup() {
  stop_comm_thread();
  // The watchdog returns once the calls in flight have finished (or ends the job on a timeout).
  {
    std::lock_guard lock(watch_mutex_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  // Errors are ignored from here on: at process exit the CUDA runtime may already be unloading.
  (void)cudaStreamSynchronize(stream_);
  barrier_buf_ = Tensor();
  (void)ncclCommDestroy(comm_);
  (void)cudaEventDestroy(ready_);
}

void NcclProcessGroup::check(ncclResult_t result, const char* what) const {
  if (result == ncclSuccess) return;
  MT_FAIL(what, " on group ", name_, " (rank ", rank_, " of ", size_,
          ") failed: ", nccl_error(result, comm_));
}

std::unique_ptr<ProcessGroup> NcclProcessGroup::split(int color, int key) {
  MT_CHECK(color >= 0, "split on group ", name_, ": color must be >= 0, got ", color);
  // The child's members in world ranks: every member's color and key, gathered.
  std::vector<int> child_ranks;
  if (!world_ranks_.empty()) {
    const auto on_device = runtime::TensorOptions{}.with_dtype(DType::I64).with_device(device());
    Tensor all = Tensor::empty({2 * int64_t(size_)}, on_device);
    const Tensor mine = runtime::from_vector<int64_t>({color, key}, {2}, {DType::I64});
    all_gather_into(all, mine.to(device()), "split.members");
    const std::vector<int64_t> ck = all.to(Device::cpu()).to_vector<int64_t>();
    std::vector<std::pair<int64_t, int>> members;  // (key, parent rank) of the child's color
    for (int p = 0; p < size_; ++p)
      if (ck[size_t(2 * p)] == color) members.push_back({ck[size_t(2 * p + 1)], p});
    std::sort(members.begin(), members.end());
    for (const auto& [k, p] : members) child_ranks.push_back(world_ranks_.at(size_t(p)));
  }
  std::lock_guard call(call_mutex_);
  MT_CHECK(!batch_, "split on group ", name_, " while a batch_isend_irecv is being posted");
  ncclComm_t child = nullptr;
  {
    HostCallWatch host(*this, detail::concat("split (ncclCommSplit, color ", color, ")"),
                       /*is_collective=*/false);
    check(ncclCommSplit(comm_, color, key, &child, nullptr), "split (ncclCommSplit)");
  }
  return std::unique_ptr<NcclProcessGroup>(new NcclProcessGroup(
      child, detail::concat(name_, "/split(", color, ",", key, ")"), std::move(child_ranks)));
}

Work NcclProcessGroup::dispatch(const char* collective, std::packaged_task<void()> task,
                                bool async_op, const std::vector<Tensor>& tensors) {
  std::lock_guard call(call_mutex_);
  MT_CHECK(cuda::current_device() == device_, collective, " on group ", name_,
           ": the current device is cuda:", cuda::current_device(),
           " but the group drives cuda:", device_);
  for (const Tensor& t : tensors) cuda::check_on_current_device(t, collective);
  std::future<void> result = task.get_future();
  // The NCCL stream starts after the work already queued on the caller's stream.
  MT_CUDA_CHECK(cudaEventRecord(ready_, cuda::current_stream()));
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  for (const Tensor& t : tensors) {
    if (t.storage()->has_memory()) cuda::record_stream(t, stream_);
  }
  std::shared_ptr<Event> timed_end;  // while tracing: recorded after the call
  if (CommTrace::active()) {
    auto start = std::make_shared<Event>(/*timing=*/true);
    MT_CUDA_CHECK(cudaEventRecord(start->event, stream_));
    if (batch_ && !batch_->timed_end) batch_->timed_end = std::make_shared<Event>(true);
    timed_end = batch_ ? batch_->timed_end : std::make_shared<Event>(true);
    running_times_ = std::make_shared<CallTimes>(device_, start, timed_end);
  }
  {
    cuda::StreamGuard guard(stream_);  // staging copies and conversions too
    HostCallWatch host(*this, collective, /*is_collective=*/true);
    task();  // its record takes running_times_
  }
  running_times_.reset();
  result.get();  // argument and NCCL errors of the call surface here
  if (timed_end && !batch_) MT_CUDA_CHECK(cudaEventRecord(timed_end->event, stream_));
  if (batch_) {
    // Queued in the group: it runs when the group ends, which records the batch's event.
    MT_CHECK(async_op, collective, " on group ", name_,
             ": only posted messages (isend, irecv) can be part of a batch_isend_irecv");
    batch_->last_call = last_collective();
    return event_work(batch_->done);
  }
  auto done = std::make_shared<Event>();
  MT_CUDA_CHECK(cudaEventRecord(done->event, stream_));
  watch({last_collective(), collective_timeout(), done});
  Work work = event_work(done);
  if (async_op) return work;
  work.wait();
  if (std::strcmp(collective, "barrier") == 0) {
    // A barrier the host can rely on (the watchdog ends the job if it never completes).
    while (!work.is_completed()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return Work();
}

std::shared_ptr<const DeviceTimes> NcclProcessGroup::device_times_of_running_call() const {
  return running_times_;
}

Work NcclProcessGroup::event_work(std::shared_ptr<Event> done) {
  return Work(
      [done] { MT_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(), done->event, 0)); },
      [done] {
        const cudaError_t s = done->status();
        if (s == cudaErrorNotReady) return false;
        MT_CUDA_CHECK(s);
        return true;
      });
}

void NcclProcessGroup::begin_point_to_point_batch() {
  std::unique_lock call(call_mutex_);  // held until end_point_to_point_batch
  MT_CHECK(!batch_, "batch_isend_irecv on group ", name_, ": a batch is already being posted");
  Batch batch{std::make_shared<Event>(), nullptr, std::nullopt};  // before the group opens
  check(ncclGroupStart(), "batch_isend_irecv (ncclGroupStart)");
  batch_.emplace(std::move(batch));
  call.release();
}

void NcclProcessGroup::end_point_to_point_batch() {
  std::unique_lock call(call_mutex_, std::adopt_lock);  // locked since begin
  MT_CHECK(batch_, "batch_isend_irecv on group ", name_, ": no batch is being posted");
  const Batch batch = *std::move(batch_);
  batch_.reset();
  ncclResult_t r = ncclSuccess;
  {
    // The group launches here; the first messages between two ranks also connect them, which
    // waits for the peer.
    HostCallWatch host(*this, "batch_isend_irecv (ncclGroupEnd)", /*is_collective=*/false);
    r = ncclGroupEnd();
  }
  check(r, "batch_isend_irecv (ncclGroupEnd)");
  if (batch.timed_end) MT_CUDA_CHECK(cudaEventRecord(batch.timed_end->event, stream_));
  MT_CUDA_CHECK(cudaEventRecord(batch.done->event, stream_));
  if (batch.last_call) watch({*batch.last_call, collective_timeout(), batch.done});
}

void NcclProcessGroup::watch(Pending pending) {
  {
    std::lock_guard lock(watch_mutex_);
    start_watchdog();
    pending_.push_back(std::move(pending));
  }
  watch_cv_.notify_one();
}

void NcclProcessGroup::start_watchdog() {
  if (!watchdog_.joinable()) watchdog_ = std::thread(&NcclProcessGroup::watchdog_loop, this);
}

void NcclProcessGroup::watchdog_loop() {
  (void)cudaSetDevice(device_);
  std::unique_lock lock(watch_mutex_);
  for (;;) {
    // Calls finish in issue order (one stream): drop the finished ones from the front.
    cudaError_t status = cudaSuccess;
    while (!pending_.empty() && (status = pending_.front().done->status()) == cudaSuccess) {
      pending_.pop_front();
    }
    const auto now = std::chrono::steady_clock::now();
    if (host_call_ && host_call_->timeout.count() > 0 &&
        now - host_call_->entered > host_call_->timeout) {
      std::string what = host_call_->what;
      if (host_call_->is_collective) {  // the task has recorded the call by now
        const CollectiveRecord call = last_collective();
        what = detail::concat(what, " '", call.name, "' (call #", call.seq, ")");
      }
      end_job(detail::concat(
          "collective timeout: ", what, " on group ", name_, " (rank ", rank_, " of ",
          size_, ") did not return to the host within ",
          double(host_call_->timeout.count()) / 1000.0, " s ([comm] timeout_seconds). NCCL waits "
          "in it for every rank of the group (connection set-up on a communicator's first calls, "
          "ncclCommSplit): a rank did not reach it.\n  (NCCL backend: the communicator was "
          "aborted with ncclCommAbort; where the other ranks are is unknown)\nEnding every rank "
          "of the job."));
    }
    if (pending_.empty()) {
      if (stopping_) return;
      if (host_call_) {
        watch_cv_.wait_for(lock, std::chrono::milliseconds(10));
      } else {
        watch_cv_.wait(lock, [&] { return stopping_ || !pending_.empty() || host_call_; });
      }
      continue;
    }
    const Pending& oldest = pending_.front();
    if (status != cudaErrorNotReady) {
      end_job(detail::concat("CUDA error ", cudaGetErrorName(status), " (",
                             cudaGetErrorString(status), ") while ", oldest.call.collective, " '",
                             oldest.call.name, "' (call #", oldest.call.seq, " on group ", name_,
                             ", rank ", rank_, " of ", size_, ") ran. Ending the job."));
    }
    ncclResult_t async_error = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async_error) == ncclSuccess && async_error != ncclSuccess &&
        async_error != ncclInProgress) {
      end_job(detail::concat("NCCL error while ", oldest.call.collective, " '", oldest.call.name,
                             "' (call #", oldest.call.seq, " on group ", name_, ", rank ", rank_,
                             " of ", size_, ") ran: ", nccl_error(async_error, comm_),
                             ". Ending the job."));
    }
    if (oldest.timeout.count() > 0 && now - oldest.call.started > oldest.timeout) {
      // NCCL cannot ask the other ranks where they are: the report names this rank's call only.
      end_job(describe_collective_timeout(name_, rank_, size_, oldest.call,
                                          double(oldest.timeout.count()) / 1000.0, {},
                                          /*point_to_point=*/true) +
              "\n  (NCCL backend: the communicator was aborted with ncclCommAbort; where the "
              "other ranks are is unknown)");
    }
    watch_cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
}

void NcclProcessGroup::end_job(const std::string& message) {
  // Frees kernels stuck waiting for peers; NCCL may itself hang here, so give it 10 s at most.
  auto aborted = std::make_shared<std::promise<void>>();
  std::future<void> done = aborted->get_future();
  std::thread([comm = comm_, aborted] {
    (void)ncclCommAbort(comm);
    aborted->set_value();
  }).detach();
  done.wait_for(std::chrono::seconds(10));
  end_job_now(rank_, message);
}

void NcclProcessGroup::do_all_reduce(const Tensor& buf, ReduceOp op) {
  if (buf.numel() == 0) return;
  check(ncclAllReduce(buf.data_ptr(), buf.data_ptr(), size_t(buf.numel()), nccl_type(buf.dtype()),
                      nccl_op(op), comm_, stream_),
        "all_reduce (ncclAllReduce)");
}

void NcclProcessGroup::do_all_gather(const Tensor& out, const Tensor& in) {
  if (in.numel() == 0) return;
  check(ncclAllGather(in.data_ptr(), out.data_ptr(), size_t(in.numel()), nccl_type(in.dtype()),
                      comm_, stream_),
        "all_gather_into (ncclAllGather)");
}

void NcclProcessGroup::do_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) {
  if (out.numel() == 0) return;
  check(ncclReduceScatter(in.data_ptr(), out.data_ptr(), size_t(out.numel()), nccl_type(in.dtype()),
                          nccl_op(op), comm_, stream_),
        "reduce_scatter_into (ncclReduceScatter)");
}

void NcclProcessGroup::do_broadcast(const Tensor& buf, int root) {
  if (buf.numel() == 0) return;
  check(ncclBroadcast(buf.data_ptr(), buf.data_ptr(), size_t(buf.numel()), nccl_type(buf.dtype()),
                      root, comm_, stream_),
        "broadcast (ncclBroadcast)");
}

void NcclProcessGroup::do_barrier() { do_all_reduce(barrier_buf_, ReduceOp::Sum); }

void NcclProcessGroup::do_all_to_all(const Tensor& out, const Tensor& in,
                                     const std::vector<int64_t>& out_counts,
                                     const std::vector<int64_t>& in_counts) {
  const size_t me = size_t(rank_);
  MT_CHECK(in_counts[me] == out_counts[me], "all_to_all_single on group ", name_, " (rank ", rank_,
           " of ", size_, "): expected ", out_counts[me], " elements from rank ", rank_,
           " (out_splits), which sends ", in_counts[me], " (its in_splits); out shape ",
           out.shape(), ", in shape ", in.shape());
  const size_t es = in.element_size();
  std::vector<int64_t> in_displ(size_t(size_), 0), out_displ(size_t(size_), 0);
  for (int j = 1; j < size_; ++j) {
    in_displ[size_t(j)] = in_displ[size_t(j - 1)] + in_counts[size_t(j - 1)];
    out_displ[size_t(j)] = out_displ[size_t(j - 1)] + out_counts[size_t(j - 1)];
  }
  if (in_counts[me] > 0) {
    MT_CUDA_CHECK(cudaMemcpyAsync(bytes_of(out) + out_displ[me] * es,
                                  bytes_of(in) + in_displ[me] * es, size_t(in_counts[me]) * es,
                                  cudaMemcpyDeviceToDevice, stream_));
  }
  if (size_ == 1) return;
  const ncclDataType_t type = nccl_type(in.dtype());
  ncclResult_t r = ncclGroupStart();
  for (int j = 0; j < size_ && r == ncclSuccess; ++j) {
    const size_t p = size_t(j);
    if (j == rank_) continue;
    if (out_counts[p] > 0) {
      r = ncclRecv(bytes_of(out) + out_displ[p] * es, size_t(out_counts[p]), type, j, comm_,
                   stream_);
    }
    if (r == ncclSuccess && in_counts[p] > 0) {
      r = ncclSend(bytes_of(in) + in_displ[p] * es, size_t(in_counts[p]), type, j, comm_, stream_);
    }
  }
  const ncclResult_t end = ncclGroupEnd();  // also after a failed call, to close the group
  check(r != ncclSuccess ? r : end, "all_to_all_single (ncclSend/ncclRecv)");
}

void NcclProcessGroup::do_send(const Tensor& buf, int dst, int /*tag*/) {
  if (buf.numel() == 0) return;
  check(ncclSend(buf.data_ptr(), size_t(buf.numel()), nccl_type(buf.dtype()), dst, comm_, stream_),
        "send (ncclSend)");
}

void NcclProcessGroup::do_recv(const Tensor& buf, int src, int /*tag*/) {
  if (buf.numel() == 0) return;
  check(ncclRecv(buf.data_ptr(), size_t(buf.numel()), nccl_type(buf.dtype()), src, comm_, stream_),
        "recv (ncclRecv)");
}

}  // namespace mt::parallel
