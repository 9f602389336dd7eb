#include "tests/testing/in_order_p2p.h"

#include <future>
#include <thread>

#include "runtime/core/error.h"

namespace mt::testing {

using parallel::MpiProcessGroup;
using parallel::ReduceOp;
using parallel::Work;

namespace {
constexpr int kTag = 0;  // one tag: messages between two ranks match in issue order

MPI_Datatype bytes_type() { return MPI_BYTE; }
}  // namespace

struct InOrderPointToPointGroup::Batch {
  std::vector<Message> messages;
  std::shared_ptr<Work> done = std::make_shared<Work>();  // set when the batch is queued
};

InOrderPointToPointGroup::InOrderPointToPointGroup(std::shared_ptr<MpiProcessGroup> inner,
                                                   std::chrono::milliseconds deadline)
    : inner_(std::move(inner)), deadline_(deadline) {
  MT_CHECK(inner_ != nullptr && inner_->communicator() != MPI_COMM_NULL,
           "InOrderPointToPointGroup: needs an MPI group of launched ranks");
}

InOrderPointToPointGroup::~InOrderPointToPointGroup() { stop_comm_thread(); }

std::unique_ptr<parallel::ProcessGroup> InOrderPointToPointGroup::split(int color, int key) {
  std::unique_ptr<parallel::ProcessGroup> child = inner_->split(color, key);
  auto* mpi = dynamic_cast<MpiProcessGroup*>(child.get());
  MT_CHECK(mpi != nullptr, "InOrderPointToPointGroup::split: the MPI split is not an MPI group");
  child.release();
  return std::make_unique<InOrderPointToPointGroup>(std::shared_ptr<MpiProcessGroup>(mpi),
                                                    deadline_);
}

void InOrderPointToPointGroup::do_all_reduce(const Tensor& buf, ReduceOp op) {
  inner_->all_reduce(buf, op, "in_order.all_reduce");
}
void InOrderPointToPointGroup::do_all_gather(const Tensor& out, const Tensor& in) {
  inner_->all_gather_into(out, in, "in_order.all_gather");
}
void InOrderPointToPointGroup::do_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) {
  inner_->reduce_scatter_into(out, in, op, "in_order.reduce_scatter");
}
void InOrderPointToPointGroup::do_broadcast(const Tensor& buf, int root) {
  inner_->broadcast(buf, root, "in_order.broadcast");
}
void InOrderPointToPointGroup::do_barrier() { inner_->barrier("in_order.barrier"); }
void InOrderPointToPointGroup::do_all_to_all(const Tensor& out, const Tensor& in,
                                             const std::vector<int64_t>& out_counts,
                                             const std::vector<int64_t>& in_counts) {
  // Counts are elements: one element per row of the flattened buffers.
  inner_->all_to_all_single(out.view({out.numel()}), in.view({in.numel()}), out_counts, in_counts,
                            "in_order.all_to_all");
}

void InOrderPointToPointGroup::run_messages(const std::vector<Message>& messages) {
  MPI_Comm comm = inner_->communicator();
  std::vector<MPI_Request> requests(messages.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    const int bytes = int(m.buf.nbytes());
    const int rc =
        m.send ? MPI_Issend(m.buf.data_ptr(), bytes, bytes_type(), m.peer, kTag, comm, &requests[i])
               : MPI_Irecv(m.buf.data_ptr(), bytes, bytes_type(), m.peer, kTag, comm, &requests[i]);
    MT_CHECK(rc == MPI_SUCCESS, "InOrderPointToPointGroup: posting a message failed");
  }
  const auto until = std::chrono::steady_clock::now() + deadline_;
  for (;;) {
    int flag = 0;
    MT_CHECK(MPI_Testall(int(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE) ==
                 MPI_SUCCESS,
             "InOrderPointToPointGroup: testing messages failed");
    if (flag != 0) return;
    if (std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::string what;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (requests[i] == MPI_REQUEST_NULL) continue;
    what +=
        detail::concat(what.empty() ? "" : ", ", messages[i].send ? "send to " : "receive from ",
                       messages[i].peer, " (", messages[i].buf.nbytes(), " bytes)");
    // Left to complete when matched (the peer's stream may reach it later), its buffer kept.
    MPI_Request_free(&requests[i]);
    std::lock_guard lock(abandoned_mutex_);
    abandoned_.push_back(messages[i].buf);
  }
  MT_FAIL("in-order point-to-point on group ", name(), " (rank ", rank(), "): ", what,
          " did not complete within ", deadline_.count(),
          " ms: these messages would deadlock on in-order streams (NCCL)");
}

void InOrderPointToPointGroup::do_send(const Tensor& buf, int dst, int /*tag*/) {
  run_messages({{true, buf, dst}});
}

void InOrderPointToPointGroup::do_recv(const Tensor& buf, int src, int /*tag*/) {
  run_messages({{false, buf, src}});
}

// In a batch: the message joins it, and its Work is the batch's.
std::optional<Work> InOrderPointToPointGroup::post_send(const Tensor& buf, int dst, int /*tag*/) {
  if (!batch_) return std::nullopt;  // send(async): queued on the communication thread
  batch_->messages.push_back({true, buf, dst});
  return batch_work();
}

std::optional<Work> InOrderPointToPointGroup::post_recv(const Tensor& buf, int src, int /*tag*/) {
  if (!batch_) return std::nullopt;
  batch_->messages.push_back({false, buf, src});
  return batch_work();
}

Work InOrderPointToPointGroup::batch_work() const {
  std::shared_ptr<Work> done = batch_->done;
  return Work([done] { done->wait(); }, [done] { return done->is_completed(); });
}

void InOrderPointToPointGroup::begin_point_to_point_batch() {
  MT_CHECK(!batch_, "InOrderPointToPointGroup: a batch is already being posted");
  batch_ = std::make_shared<Batch>();
}

void InOrderPointToPointGroup::end_point_to_point_batch() {
  const std::shared_ptr<Batch> batch = std::move(batch_);
  batch_.reset();
  std::vector<Tensor> tensors;
  for (const Message& m : batch->messages) tensors.push_back(m.buf);
  std::packaged_task<void()> task([this, messages = batch->messages] { run_messages(messages); });
  // Queued behind every message issued before it, as a group on a stream.
  *batch->done = dispatch("batch_isend_irecv", std::move(task), /*async_op=*/true, tensors);
}

}  // namespace mt::testing
