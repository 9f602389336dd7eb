// ProcessGroup frontend: argument checks, staging (contiguous copies, f32 accumulation for 16-bit
// floats, Avg as Sum / size), per-name stats and the communication thread.
#include "parallel/comm/process_group.h"

#include <atomic>
#include <chrono>
#include <numeric>
#include <optional>
#include <utility>

#include "runtime/core/error.h"
#include "runtime/core/profiler.h"

namespace mt::parallel {

using runtime::DType;

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

namespace {
std::atomic<int64_t> g_collective_timeout_ms{300'000};
// The batch_isend_irecv whose ops this thread is posting (CommRecord::batch); 0 outside one.
thread_local int64_t t_posting_batch = 0;
}  // namespace

void set_collective_timeout(std::chrono::milliseconds timeout) {
  MT_CHECK(timeout.count() >= 0, "set_collective_timeout: expected >= 0 ms, got ", timeout.count());
  g_collective_timeout_ms = timeout.count();
}

std::chrono::milliseconds collective_timeout() {
  return std::chrono::milliseconds(g_collective_timeout_ms.load());
}

ScopedCollectiveTimeout::ScopedCollectiveTimeout(std::chrono::milliseconds timeout)
    : previous_(collective_timeout()) {
  set_collective_timeout(timeout);
}

ScopedCollectiveTimeout::~ScopedCollectiveTimeout() { set_collective_timeout(previous_); }

void Work::wait() const {
  ExposedCommScope blocked;
  if (wait_) wait_();
  if (done_.valid()) done_.get();
}

bool Work::is_completed() const {
  if (is_completed_) return is_completed_();
  return !done_.valid() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

namespace {

bool is_16bit_float(DType d) { return d == DType::BF16 || d == DType::F16; }

// "all_reduce on group mpi:world (rank 0 of 2)"
std::string where(const char* collective, const ProcessGroup& g) {
  return detail::concat(collective, " on group ", g.name(), " (rank ", g.rank(), " of ", g.size(),
                        ")");
}

void check_tensor(const Tensor& t, const char* what, const char* collective,
                  const ProcessGroup& g) {
  MT_CHECK(t.defined(), where(collective, g), ": ", what, " is an undefined tensor");
  MT_CHECK(t.device().type == g.device_type(), where(collective, g), ": ", what, " must be a ",
           runtime::device_type_name(g.device_type()), " tensor for this backend, got device ",
           runtime::device_type_name(t.device().type));
}

void check_reducible(const Tensor& t, ReduceOp op, const char* collective, const ProcessGroup& g) {
  MT_CHECK(t.dtype() != DType::Bool, where(collective, g), ": cannot reduce a bool tensor");
  MT_CHECK(op != ReduceOp::Avg || t.is_floating_point(), where(collective, g),
           ": avg needs a floating dtype, got ", t.dtype());
}

// Same dtype, same rank, same trailing dims; dim 0 of `big` is `factor` * dim 0 of `small`
// (factor 0: any dim 0).
void check_rows(const Tensor& big, const Tensor& small, int64_t factor, const char* big_name,
                const char* small_name, const char* collective, const ProcessGroup& g) {
  MT_CHECK(big.dtype() == small.dtype(), where(collective, g), ": ", big_name, " dtype ",
           big.dtype(), " differs from ", small_name, " dtype ", small.dtype());
  bool ok = big.dim() >= 1 && big.dim() == small.dim();
  for (int64_t d = 1; ok && d < big.dim(); ++d) ok = big.size(d) == small.size(d);
  if (ok && factor > 0) ok = big.size(0) == factor * small.size(0);
  MT_CHECK(
      ok, where(collective, g), ": expected ", big_name, " to have ",
      factor > 0 ? detail::concat(factor, " x the rows of ") : std::string("the row shape of "),
      small_name, " (same trailing dims), got ", big_name, " shape ", big.shape(), " and ",
      small_name, " shape ", small.shape());
}

// A contiguous buffer holding t's values, in f32 when t is bf16/f16 and `upcast`.
Tensor staged(const Tensor& t, bool upcast) {
  if (upcast && is_16bit_float(t.dtype())) return t.to(DType::F32).contiguous();
  return t.contiguous();
}

// Output buffer for `t`: t itself when it can be written directly.
Tensor out_buffer(const Tensor& t, bool upcast) {
  if (upcast && is_16bit_float(t.dtype())) {
    return Tensor::empty(t.shape(), t.options().with_dtype(DType::F32));
  }
  if (t.is_contiguous()) return t;
  return Tensor::empty(t.shape(), t.options());
}

void copy_back(const Tensor& dst, const Tensor& buf) {
  if (!buf.same(dst)) dst.copy_(buf);
}

void divide_in_place(const Tensor& buf, int n) {
  if (n == 1) return;
  int64_t count = buf.numel();
  if (buf.dtype() == DType::F64) {
    double* p = buf.data<double>();
    for (int64_t i = 0; i < count; ++i) p[i] /= n;
  } else {
    float* p = buf.data<float>();  // 16-bit floats were staged in f32
    for (int64_t i = 0; i < count; ++i) p[i] /= float(n);
  }
}

// The op the backend runs: Avg becomes Sum when the frontend divides afterwards (host_avg).
ReduceOp backend_op(ReduceOp op, bool host_avg) { return host_avg ? ReduceOp::Sum : op; }

// `peer` is another rank of g, or this one inside a batch of a backend that batches messages to
// itself (batch_isend_irecv checks that they pair up).
void check_peer(int peer, const char* what, const char* collective, const ProcessGroup& g) {
  const bool itself_allowed = t_posting_batch != 0 && g.batches_messages_to_itself();
  MT_CHECK(peer >= 0 && peer < g.size() && (peer != g.rank() || itself_allowed),
           where(collective, g), ": ", what, " must be another rank in [0, ", g.size(), "), got ",
           peer);
}

}  // namespace

ProcessGroup::~ProcessGroup() { stop_comm_thread(); }

Work ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op, const std::string& name,
                              bool async_op) {
  check_tensor(tensor, "tensor", "all_reduce", *this);
  check_reducible(tensor, op, "all_reduce", *this);
  Tensor t = tensor.detach();
  CommRecord call = describe_call(name, int64_t(t.nbytes()), &t, &t);
  call.reduce_op = reduce_op_name(op);
  return submit("all_reduce", std::move(call), async_op, {t}, [this, t, op] {
    const bool host_avg = op == ReduceOp::Avg && !backend_reduces_avg();
    Tensor buf = staged(t, true);
    do_all_reduce(buf, backend_op(op, host_avg));
    if (host_avg) divide_in_place(buf, size());
    copy_back(t, buf);
  });
}

Work ProcessGroup::all_gather_into(const Tensor& out, const Tensor& in, const std::string& name,
                                   bool async_op) {
  check_tensor(out, "out", "all_gather_into", *this);
  check_tensor(in, "in", "all_gather_into", *this);
  check_rows(out, in, size(), "out", "in", "all_gather_into", *this);
  Tensor o = out.detach(), i = in.detach();
  CommRecord call = describe_call(name, int64_t(o.nbytes()), &i, &o);
  return submit("all_gather_into", std::move(call), async_op, {o, i}, [this, o, i] {
    Tensor ob = out_buffer(o, false);
    do_all_gather(ob, i.contiguous());
    copy_back(o, ob);
  });
}

Work ProcessGroup::reduce_scatter_into(const Tensor& out, const Tensor& in, ReduceOp op,
                                       const std::string& name, bool async_op) {
  check_tensor(out, "out", "reduce_scatter_into", *this);
  check_tensor(in, "in", "reduce_scatter_into", *this);
  check_rows(in, out, size(), "in", "out", "reduce_scatter_into", *this);
  check_reducible(in, op, "reduce_scatter_into", *this);
  Tensor o = out.detach(), i = in.detach();
  CommRecord call = describe_call(name, int64_t(i.nbytes()), &i, &o);
  call.reduce_op = reduce_op_name(op);
  return submit("reduce_scatter_into", std::move(call), async_op, {o, i},
                [this, o, i, op] {
                  const bool host_avg = op == ReduceOp::Avg && !backend_reduces_avg();
                  Tensor ob = out_buffer(o, true);
                  do_reduce_scatter(ob, staged(i, true), backend_op(op, host_avg));
                  if (host_avg) divide_in_place(ob, size());
                  copy_back(o, ob);
                });
}

Work ProcessGroup::broadcast(const Tensor& tensor, int root, const std::string& name,
                             bool async_op) {
  check_tensor(tensor, "tensor", "broadcast", *this);
  MT_CHECK(root >= 0 && root < size(), where("broadcast", *this), ": root must be in [0, ", size(),
           "), got ", root);
  Tensor t = tensor.detach();
  CommRecord call = describe_call(name, int64_t(t.nbytes()), &t, &t);
  call.peer = root;
  return submit("broadcast", std::move(call), async_op, {t}, [this, t, root] {
    Tensor buf = t.contiguous();
    do_broadcast(buf, root);
    copy_back(t, buf);
  });
}

Work ProcessGroup::barrier(const std::string& name, bool async_op) {
  return submit("barrier", describe_call(name, 0, nullptr, nullptr), async_op, {},
                [this] { do_barrier(); });
}

Work ProcessGroup::all_to_all_single(const Tensor& out, const Tensor& in,
                                     std::vector<int64_t> out_splits,
                                     std::vector<int64_t> in_splits, const std::string& name,
                                     bool async_op) {
  const char* c = "all_to_all_single";
  check_tensor(out, "out", c, *this);
  check_tensor(in, "in", c, *this);
  check_rows(out, in, 0, "out", "in", c, *this);
  auto fill_even = [&](std::vector<int64_t>& splits, const Tensor& t, const char* what) {
    if (!splits.empty()) return;
    MT_CHECK(t.size(0) % size() == 0, where(c, *this), ": no ", what, " given and ", what,
             "'s dim 0 (", t.size(0), ") is not divisible by the group size; shape ", t.shape());
    splits.assign(size_t(size()), t.size(0) / size());
  };
  fill_even(out_splits, out, "out_splits");
  fill_even(in_splits, in, "in_splits");
  auto check_splits = [&](const std::vector<int64_t>& splits, const Tensor& t, const char* what) {
    MT_CHECK(int64_t(splits.size()) == size(), where(c, *this), ": expected ", size(), " ", what,
             ", got ", splits);
    for (int64_t s : splits) MT_CHECK(s >= 0, where(c, *this), ": negative ", what, " ", splits);
    int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t(0));
    MT_CHECK(total == t.size(0), where(c, *this), ": ", what, " ", splits, " sum to ", total,
             " rows but the tensor has shape ", t.shape());
  };
  check_splits(out_splits, out, "out_splits");
  check_splits(in_splits, in, "in_splits");
  int64_t row = 1;  // elements per row
  for (int64_t d = 1; d < in.dim(); ++d) row *= in.size(d);
  for (auto& s : out_splits) s *= row;
  for (auto& s : in_splits) s *= row;
  Tensor o = out.detach(), i = in.detach();
  CommRecord call = describe_call(name, int64_t(i.nbytes()), &i, &o);
  if (CommTrace::active()) {
    for (int64_t s : out_splits) call.recv_bytes.push_back(s * int64_t(o.element_size()));
    for (int64_t s : in_splits) call.send_bytes.push_back(s * int64_t(i.element_size()));
  }
  return submit(c, std::move(call), async_op, {o, i},
                [this, o, i, oc = std::move(out_splits), ic = std::move(in_splits)] {
                  Tensor ob = out_buffer(o, false);
                  do_all_to_all(ob, i.contiguous(), oc, ic);
                  copy_back(o, ob);
                });
}

Work ProcessGroup::send(const Tensor& tensor, int dst, int tag, const std::string& name,
                        bool async_op) {
  check_tensor(tensor, "tensor", "send", *this);
  check_peer(dst, "dst", "send", *this);
  MT_CHECK(tag >= 0, where("send", *this), ": tag must be >= 0, got ", tag);
  Tensor t = tensor.detach();
  CommRecord call = describe_call(name, int64_t(t.nbytes()), &t, nullptr);
  call.peer = dst;
  call.tag = tag;
  return submit("send", std::move(call), async_op, {t},
                [this, t, dst, tag] { do_send(t.contiguous(), dst, tag); });
}

Work ProcessGroup::recv(const Tensor& tensor, int src, int tag, const std::string& name,
                        bool async_op) {
  check_tensor(tensor, "tensor", "recv", *this);
  check_peer(src, "src", "recv", *this);
  MT_CHECK(tag >= 0, where("recv", *this), ": tag must be >= 0, got ", tag);
  Tensor t = tensor.detach();
  CommRecord call = describe_call(name, int64_t(t.nbytes()), nullptr, &t);
  call.peer = src;
  call.tag = tag;
  return submit("recv", std::move(call), async_op, {t}, [this, t, src, tag] {
    Tensor buf = out_buffer(t, false);
    do_recv(buf, src, tag);
    copy_back(t, buf);
  });
}

namespace {

// The arguments of an isend / irecv (`peer_name`: "dst" or "src").
void check_posted(const Tensor& tensor, int peer, int tag, const char* collective,
                  const char* peer_name, const ProcessGroup& g) {
  check_tensor(tensor, "tensor", collective, g);
  check_peer(peer, peer_name, collective, g);
  MT_CHECK(tag >= 0, where(collective, g), ": tag must be >= 0, got ", tag);
  MT_CHECK(tensor.is_contiguous(), where(collective, g), ": the tensor must be contiguous, got ",
           "shape ", tensor.shape(), " with strides ", tensor.strides());
}

}  // namespace

Work ProcessGroup::isend(const Tensor& tensor, int dst, int tag, const std::string& name) {
  check_posted(tensor, dst, tag, "isend", "dst", *this);
  Tensor t = tensor.detach();
  std::optional<Work> posted = post_send(t, dst, tag);
  if (!posted) return send(t, dst, tag, name, /*async_op=*/true);
  CommRecord call = describe_call(name, int64_t(t.nbytes()), &t, nullptr);
  call.peer = dst;
  call.tag = tag;
  return track_posted("isend", std::move(call), *std::move(posted));
}

Work ProcessGroup::irecv(const Tensor& tensor, int src, int tag, const std::string& name) {
  check_posted(tensor, src, tag, "irecv", "src", *this);
  Tensor t = tensor.detach();
  std::optional<Work> posted = post_recv(t, src, tag);
  if (!posted) return recv(t, src, tag, name, /*async_op=*/true);
  CommRecord call = describe_call(name, int64_t(t.nbytes()), nullptr, &t);
  call.peer = src;
  call.tag = tag;
  return track_posted("irecv", std::move(call), *std::move(posted));
}

namespace {

std::atomic<int64_t> g_batches{0};  // batch_isend_irecv calls so far in this process

// Marks the ops this thread posts while alive as one batch's (CommRecord::batch).
class PostingBatch {
 public:
  PostingBatch() : previous_(t_posting_batch) { t_posting_batch = ++g_batches; }
  ~PostingBatch() { t_posting_batch = previous_; }
  PostingBatch(const PostingBatch&) = delete;
  PostingBatch& operator=(const PostingBatch&) = delete;

 private:
  int64_t previous_;
};

}  // namespace

std::vector<Work> ProcessGroup::batch_isend_irecv(const std::vector<P2POp>& ops) {
  const PostingBatch batch;  // before the checks: they allow messages to itself in a batch
  std::vector<std::pair<int64_t, int>> to_itself, from_itself;  // (bytes, tag), in order
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const bool send = op.kind == P2POp::Kind::Send;
    check_posted(op.tensor, op.peer, op.tag, send ? "isend" : "irecv", send ? "dst" : "src",
                 *this);
    // The device index too, here: once the batch has begun (NCCL: a group is open), an op that
    // fails leaves its peers' ops of the batch waiting.
    MT_CHECK(op.tensor.device() == device(), where("batch_isend_irecv", *this), ": op ", i, " ('",
             op.name, "') is on ", op.tensor.device(), " but the group drives ", device());
    if (op.peer == rank()) {
      (send ? to_itself : from_itself).emplace_back(int64_t(op.tensor.nbytes()), op.tag);
    }
  }
  MT_CHECK(to_itself == from_itself, where("batch_isend_irecv", *this), ": its ",
           to_itself.size(), " message(s) to this rank itself and ", from_itself.size(),
           " receive(s) from itself do not pair up in order (equal sizes and tags)");
  std::vector<Work> works;
  if (ops.empty()) return works;
  begin_point_to_point_batch();
  try {
    for (const P2POp& op : ops) {
      works.push_back(op.kind == P2POp::Kind::Send ? isend(op.tensor, op.peer, op.tag, op.name)
                                                   : irecv(op.tensor, op.peer, op.tag, op.name));
    }
  } catch (...) {
    try {
      end_point_to_point_batch();
    } catch (...) {  // the posting error is the one to report
    }
    throw;
  }
  end_point_to_point_batch();
  return works;
}

std::optional<Work> ProcessGroup::post_send(const Tensor&, int, int) { return std::nullopt; }
std::optional<Work> ProcessGroup::post_recv(const Tensor&, int, int) { return std::nullopt; }

Work ProcessGroup::track_posted(const char* collective, CommRecord call, Work posted) {
  {
    std::lock_guard lock(stats_mutex_);
    CommStats& s = stats_[call.name];
    s.collective = collective;
    s.calls += 1;
    s.bytes += call.size_bytes;
  }
  if (!CommTrace::active()) return posted;
  // The record, shared by the Work's copies: finished (and added to the trace) by whichever
  // sees the message complete first, wait() or is_completed().
  struct Tracked {
    std::mutex mutex;
    CommRecord record;
    bool finished = false;
    void waiting() {
      std::lock_guard lock(mutex);
      if (finished || record.waited_us != 0) return;
      record.waited_us = wall_clock_us();
      record.ops_before_wait = runtime::Profiler::ops_recorded();
    }
    void finish() {
      std::lock_guard lock(mutex);
      if (std::exchange(finished, true)) return;
      record.end_us = wall_clock_us();
      CommTrace::add(record);
    }
  };
  auto tracked = std::make_shared<Tracked>();
  CommRecord& r = tracked->record;
  r = std::move(call);
  r.issue = CommTrace::next_issue();
  r.collective = collective;
  r.serves = ScopedCommPurpose::current();
  r.async = true;
  r.issued_us = r.start_us = wall_clock_us();
  r.ops_before = runtime::Profiler::ops_recorded();
  return Work(
      [posted, tracked] {
        tracked->waiting();
        posted.wait();
        tracked->finish();
      },
      [posted, tracked] {
        const bool done = posted.is_completed();
        if (done) tracked->finish();
        return done;
      });
}

std::map<std::string, CommStats> ProcessGroup::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void ProcessGroup::reset_stats() {
  std::lock_guard lock(stats_mutex_);
  stats_.clear();
}

CollectiveRecord ProcessGroup::last_collective() const {
  std::lock_guard lock(stats_mutex_);
  return last_;
}

CommRecord ProcessGroup::describe_call(const std::string& name, int64_t size_bytes,
                                       const Tensor* in, const Tensor* out) const {
  CommRecord r;
  r.name = name;
  r.size_bytes = size_bytes;
  if (!CommTrace::active()) return r;
  r.batch = t_posting_batch;
  r.group = this->name();
  r.mesh_dim = mesh_dim_;
  r.members = world_ranks();
  r.group_rank = rank();
  r.group_size = size();
  auto describe_tensor = [](const Tensor* t, std::vector<int64_t>& shape, uint64_t& storage,
                            int64_t& bytes) {
    if (t == nullptr) return;
    for (int64_t d = 0; d < t->dim(); ++d) shape.push_back(t->size(d));
    storage = t->storage()->id();
    bytes = int64_t(t->nbytes());
  };
  describe_tensor(in, r.in_shape, r.in_storage, r.bytes_in);
  describe_tensor(out, r.out_shape, r.out_storage, r.bytes_out);
  if (const Tensor* t = in != nullptr ? in : out) {
    r.dtype = std::string(runtime::dtype_name(t->dtype()));
  }
  return r;
}

Work ProcessGroup::submit(const char* collective, CommRecord call, bool async_op,
                          std::vector<Tensor> tensors, std::function<void()> fn) {
  {
    std::lock_guard lock(stats_mutex_);
    CommStats& s = stats_[call.name];
    s.collective = collective;
    s.calls += 1;
    s.bytes += call.size_bytes;
  }
  const bool traced = CommTrace::active();
  int64_t issue = 0;
  if (traced) {
    call.issue = issue = CommTrace::next_issue();
    call.collective = collective;
    call.serves = ScopedCommPurpose::current();
    call.async = async_op;
    call.issued_us = wall_clock_us();
    call.ops_before = runtime::Profiler::ops_recorded();
  }
  // Records the call as entered (sequence number, start time), runs it, and adds its busy time
  // (and, when tracing, its record), on whichever thread runs it. Calls of one group run one at
  // a time, in issue order.
  std::packaged_task<void()> task([this, collective, traced, call = std::move(call),
                                   fn = std::move(fn)]() mutable {
    const auto t0 = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(stats_mutex_);
      last_ = {last_.seq + 1, collective, call.name, true, t0};
      call.seq = last_.seq;
    }
    if (traced) call.start_us = wall_clock_us();
    struct Finish {  // marks the call finished even when it throws
      ProcessGroup* group;
      CommRecord& call;
      bool traced;
      std::chrono::steady_clock::time_point t0;
      ~Finish() {
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        {
          std::lock_guard lock(group->stats_mutex_);
          group->last_.running = false;
          group->stats_[call.name].seconds += seconds;
        }
        if (traced) {
          call.end_us = wall_clock_us();
          call.device_times = group->device_times_of_running_call();
          CommTrace::add(std::move(call));
        }
      }
    } finish{this, call, traced, t0};
    fn();
  });
  // The profiler shows each call as an op of the issuing thread: the whole call when it is
  // synchronous on the host (MPI), the time to queue it otherwise.
  std::optional<runtime::ProfiledKernelScope> recorded;
  if (runtime::t_profiler_records_this_thread) recorded.emplace(collective, device());
  ExposedCommScope blocked;
  Work work = dispatch(collective, std::move(task), async_op, tensors);
  if (!traced || !async_op) return work;
  // An async call: its record learns when the caller first waited for it (not when
  // is_completed() saw it done first).
  auto settled = std::make_shared<std::atomic<bool>>(false);
  return Work(
      [work, issue, settled] {
        if (!settled->exchange(true))
          CommTrace::note_wait(issue, wall_clock_us(), runtime::Profiler::ops_recorded());
        work.wait();
      },
      [work, settled] {
        const bool done = work.is_completed();
        if (done) settled->store(true);
        return done;
      });
}

Work ProcessGroup::dispatch(const char* collective, std::packaged_task<void()> task, bool async_op,
                            const std::vector<Tensor>& /*tensors*/) {
  {
    std::unique_lock lock(queue_mutex_);
    if (!async_op && !comm_thread_.joinable()) {
      lock.unlock();
      task();  // no thread yet: nothing can be queued ahead of this call
      task.get_future().get();
      return Work();
    }
    MT_CHECK(!stopping_, where(collective, *this), ": the group is shutting down");
    if (!comm_thread_.joinable()) comm_thread_ = std::thread(&ProcessGroup::comm_loop, this);
  }
  Work work(task.get_future().share());
  {
    std::lock_guard lock(queue_mutex_);
    queue_.push_back(std::move(task));
  }
  queue_cv_.notify_one();
  if (!async_op) work.wait();
  return work;
}

void ProcessGroup::comm_loop() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock lock(queue_mutex_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything issued has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void ProcessGroup::stop_comm_thread() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (comm_thread_.joinable() && comm_thread_.get_id() != std::this_thread::get_id()) {
    comm_thread_.join();
  }
}

}  // namespace mt::parallel
