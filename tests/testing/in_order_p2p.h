// A process group whose point-to-point messages behave as NCCL's do on a GPU stream, on MPI ranks
// (for CPU tests of code that must not deadlock there, such as the pipeline's message rounds):
// - every send and receive of a rank runs in issue order on one thread (the group's
//   communication thread: isend and irecv are queued there, as NCCL queues them on its stream);
// - a send waits until its receive has started (MPI_Issend), so it cannot finish ahead of the
//   peer, as NCCL's rendezvous cannot for a message larger than its buffers;
// - messages between two ranks match in issue order, whatever their tags (one MPI tag for all);
// - a batch_isend_irecv runs as one unit whose messages progress together (as one NCCL group).
// A message that has not completed within `deadline` fails its Work with an error saying the
// messages would deadlock on in-order streams (the stuck send is left to complete when matched).
// Collectives go to the wrapped MPI group.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/mpi_process_group.h"

namespace mt::testing {

using runtime::Tensor;

class InOrderPointToPointGroup : public parallel::ProcessGroup {
 public:
  explicit InOrderPointToPointGroup(std::shared_ptr<parallel::MpiProcessGroup> inner,
                                    std::chrono::milliseconds deadline = std::chrono::seconds(60));
  ~InOrderPointToPointGroup() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return "in_order:" + inner_->name(); }
  std::vector<int> world_ranks() const override { return inner_->world_ranks(); }
  std::unique_ptr<parallel::ProcessGroup> split(int color, int key) override;

 protected:
  void do_all_reduce(const Tensor& buf, parallel::ReduceOp op) override;
  void do_all_gather(const Tensor& out, const Tensor& in) override;
  void do_reduce_scatter(const Tensor& out, const Tensor& in, parallel::ReduceOp op) override;
  void do_broadcast(const Tensor& buf, int root) override;
  void do_barrier() override;
  void do_all_to_all(const Tensor& out, const Tensor& in, const std::vector<int64_t>& out_counts,
                     const std::vector<int64_t>& in_counts) override;
  void do_send(const Tensor& buf, int dst, int tag) override;
  void do_recv(const Tensor& buf, int src, int tag) override;
  std::optional<parallel::Work> post_send(const Tensor& buf, int dst, int tag) override;
  std::optional<parallel::Work> post_recv(const Tensor& buf, int src, int tag) override;
  void begin_point_to_point_batch() override;
  void end_point_to_point_batch() override;

 private:
  struct Message {
    bool send = false;
    Tensor buf;
    int peer = 0;
  };
  struct Batch;                       // the messages of a batch being posted, and their completion
  parallel::Work batch_work() const;  // a Work that completes with the batch being posted
  // Posts `messages` together and waits for all of them within the deadline.
  void run_messages(const std::vector<Message>& messages);

  std::shared_ptr<parallel::MpiProcessGroup> inner_;
  std::chrono::milliseconds deadline_;
  std::shared_ptr<Batch> batch_;  // while a batch is being posted
  std::mutex abandoned_mutex_;
  std::vector<Tensor> abandoned_;  // buffers of messages that ran out of time (MPI may use them)
};

}  // namespace mt::testing
