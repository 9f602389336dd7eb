// MpiProcessGroup: the ProcessGroup backend for CPU tensors over MPI (OpenMPI).
//
// - world(): every rank of the launch. Without a launcher in the environment (no
//   OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK/PMI_SIZE/PMI_FD) MPI is never initialised: the world
//   is this one process (rank 0 of 1) and every collective is a local copy, so a single-process
//   run needs no mpirun (nor `srun -n 1` PMI). srun starting several tasks without PMI (no
//   `--mpi=pmix` where the site's MpiDefault is none) is refused before MPI_Init, saying so:
//   OpenMPI would fail inside it with its own text, or each task would train alone.
// - MPI is initialised on first use with MPI_Init_thread(MPI_THREAD_MULTIPLE), which is required
//   (a library without it is an error saying so). MPI is finalised at exit if we initialised it
//   (see mpi_runtime.h).
// - Every collective is MPI's blocking call (MPI_Allreduce, ...: the library's tuned algorithms,
//   measured at raw MPI's bandwidth in bench/RESULTS.md), watched by the monitor thread so that
//   none waits longer than collective_timeout(): past it the rank asks the other members where
//   they are, prints the report and ends the job with MPI_Abort (exit code 124). A rank that dies
//   ends the job through the launcher (mpirun/srun end the others when one exits abnormally).
// - split(color, key) is collective over the group (MPI_Comm_split): ranks with the same color form
//   a new group, ordered by key then by rank.
// - Each group owns duplicates of its communicator (one for collectives and send/recv, one for the
//   point-to-point traffic of all_to_all_single), with MPI_ERRORS_RETURN: MPI failures become
//   mt::Error carrying MPI_Error_string.
// - Messages longer than max_message_elements() (INT_MAX by default) are split into chunks.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace mt::parallel {

class MpiProcessGroup : public ProcessGroup {
 public:
  static std::unique_ptr<MpiProcessGroup> world();
  // True when a launcher (mpirun, srun --mpi=pmix) started this process as a rank over PMI(x).
  // Throws mt::Error when srun started several tasks without PMI (see above).
  static bool launched_by_launcher();
  // For a rank that ends on an error of its own: when MPI runs with peers, ends every rank now
  // (MPI_Abort with `exit_code`), as the peers would wait in their next collective until the
  // watchdog's timeout, or without end in MPI_Finalize; returns when there are no peers.
  static void end_peers_after_error(int exit_code);

  ~MpiProcessGroup() override;

  std::unique_ptr<ProcessGroup> split(int color, int key) override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool batches_messages_to_itself() const override { return comm_ != MPI_COMM_NULL; }
  std::string name() const override { return name_; }
  std::vector<int> world_ranks() const override {
    return comm_ == MPI_COMM_NULL ? std::vector<int>{0} : world_ranks_;
  }
  // The group's communicator, for side-by-side raw MPI measurements (parallel/comm/comm_bench.h);
  // collectives go through the ProcessGroup calls.
  MPI_Comm communicator() const { return comm_; }

 protected:
  void do_all_reduce(const Tensor& buf, ReduceOp op) override;
  void do_all_gather(const Tensor& out, const Tensor& in) override;
  void do_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override;
  void do_broadcast(const Tensor& buf, int root) override;
  void do_barrier() override;
  void do_all_to_all(const Tensor& out, const Tensor& in, const std::vector<int64_t>& out_counts,
                     const std::vector<int64_t>& in_counts) override;
  void do_send(const Tensor& buf, int dst, int tag) override;
  void do_recv(const Tensor& buf, int src, int tag) override;
  // MPI_Isend / MPI_Irecv; the Work holds the buffer and must not outlive the group.
  std::optional<Work> post_send(const Tensor& buf, int dst, int tag) override;
  std::optional<Work> post_recv(const Tensor& buf, int src, int tag) override;

 private:
  // comm == MPI_COMM_NULL: the local single-process world. Takes ownership of comm.
  MpiProcessGroup(MPI_Comm comm, std::string name);
  void check(int rc, const char* what) const;
  // Runs one blocking MPI call (returning its error code) within the collective timeout; past it,
  // reports (asking the other members, or only `peer` for send/recv, where they are) and ends the
  // job. Throws mt::Error naming `what` when the call fails.
  // `since`: when the call began (a posted request's wait counts from its post); default: the
  // start of the last call entered on the group.
  void run_watched(const char* what, int peer, const std::function<int()>& call,
                   std::optional<std::chrono::steady_clock::time_point> since = {}) const;
  // The Work of posted requests over `buf` (a receive checks the element counts it got).
  Work posted_work(std::vector<MPI_Request> requests, const Tensor& buf, bool receive,
                   const char* what, int peer);
  // MPI_Waitall under run_watched.
  void wait(std::vector<MPI_Request>& requests, const char* what) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm p2p_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::string name_;
  std::vector<int> world_ranks_;  // world rank of each member
  int64_t uid_ = 0;               // the id every member uses for this group (timeout queries)
};

// Largest element count of one MPI call (INT_MAX by default); tests lower it to exercise chunking.
void set_max_message_elements(int64_t n);
int64_t max_message_elements();

}  // namespace mt::parallel
