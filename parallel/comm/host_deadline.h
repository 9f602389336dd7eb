// Ending the job when the host is stuck in a call that waits for every rank of a group and that
// no watchdog event can see (NCCL's ncclCommInitRank blocks the host until all ranks arrive).
//   HostDeadline guard(collective_timeout(), rank, "ncclCommInitRank over group world");
//   blocking_call();  // the job ends, naming the call, if this has not returned in time
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace mt::parallel {

// Prints `message` and ends every rank: MPI_Abort where MPI runs, else this process with exit
// code 124 (as a collective timeout does).
[[noreturn]] void end_job_now(int rank, const std::string& message);

class HostDeadline {
 public:
  // Starts the clock for the call named `what` (timeout 0: no limit, nothing is started).
  HostDeadline(std::chrono::milliseconds timeout, int rank, std::string what);
  ~HostDeadline();  // the call returned in time
  HostDeadline(const HostDeadline&) = delete;
  HostDeadline& operator=(const HostDeadline&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread clock_;
};

}  // namespace mt::parallel
