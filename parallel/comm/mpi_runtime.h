// Internal to the MPI backend: the MPI library's lifetime (initialised on first use when a
// launcher started the process, with MPI_THREAD_MULTIPLE; finalised at exit), and the monitor: a
// thread that answers other ranks' "where are you on group G?" queries on a private duplicate of
// MPI_COMM_WORLD, so a rank whose collective timed out can say which ranks did not arrive, and
// that watches the deadlines of the blocking MPI calls in flight (WatchedCall).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallel/comm/timeout_report.h"

namespace mt::parallel::mpi {

using Clock = std::chrono::steady_clock;

bool active();  // a launcher started us and MPI is initialised (initialises it on first call)
bool finalized();
std::string error_string(int rc);

// Collective over `comm`: an id for the new group that every member agrees on and that no other
// live group of this process has.
int64_t agree_group_uid(MPI_Comm comm);
// Groups the monitor answers for. A group unregisters before it is destroyed.
void register_group(int64_t uid, const ProcessGroup* group);
void unregister_group(int64_t uid);

// A blocking MPI call under a deadline. While one is alive, the monitor checks its deadline every
// 20 ms; once it has passed, on_timeout runs on a thread of its own (it reports and ends the job:
// the blocked call never returns). The calls themselves are MPI's blocking ones, so they run
// MPI's tuned algorithms at full speed instead of polled non-blocking schedules.
class WatchedCall {
 public:
  // deadline == Clock::time_point::max(): not watched.
  WatchedCall(Clock::time_point deadline, std::function<void()> on_timeout);
  ~WatchedCall();
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  int64_t id_ = -1;
};

// Tests the requests until all complete or the deadline passes (the monitor's own queries).
// Returns MPI_SUCCESS, the MPI error of the first failed request, or kTimedOut.
constexpr int kTimedOut = -1;
int wait_until(std::vector<MPI_Request>& requests, std::vector<MPI_Status>* statuses,
               Clock::time_point deadline);

// Asks each peer (by world rank) for its record of group `uid`; a peer that does not answer
// before `deadline` gets nullopt in its PeerRecord.
void query_peers(int64_t uid, std::vector<PeerRecord>& peers, Clock::time_point deadline);

// Prints the message on stderr and ends every rank (MPI_Abort with exit code 124).
[[noreturn]] void abort_job(const std::string& message);

}  // namespace mt::parallel::mpi
