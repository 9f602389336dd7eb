// Internal to the MPI backend: the MPI library's lifetime (initialised on first use when a
// launcher started the process, finalised at exit), the process-wide lock that serialises MPI
// calls when the library is only MPI_THREAD_SERIALIZED, polled waits that give up at a deadline,
// and the monitor: a thread that answers other ranks' "where are you on group G?" queries on a
// private duplicate of MPI_COMM_WORLD, so a rank whose collective timed out can say which ranks
// did not arrive.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/timeout_report.h"

namespace mt::parallel::mpi {

using Clock = std::chrono::steady_clock;

bool active();  // a launcher started us and MPI is initialised (initialises it on first call)
std::unique_lock<std::mutex> lock();  // empty lock when MPI_THREAD_MULTIPLE
bool finalized();
std::string error_string(int rc);

// Collective over `comm`: an id for the new group that every member agrees on and that no other
// live group of this process has.
int64_t agree_group_uid(MPI_Comm comm);
// Groups the monitor answers for. A group unregisters before it is destroyed.
void register_group(int64_t uid, const ProcessGroup* group);
void unregister_group(int64_t uid);

// Tests the requests (taking lock() only while testing) until all complete or the deadline
// passes. Returns MPI_SUCCESS, the MPI error of the first failed request, or kTimedOut.
constexpr int kTimedOut = -1;
int wait_until(std::vector<MPI_Request>& requests, std::vector<MPI_Status>* statuses,
               Clock::time_point deadline);

// Asks each peer (by world rank) for its record of group `uid`; a peer that does not answer
// before `deadline` gets nullopt in its PeerRecord.
void query_peers(int64_t uid, std::vector<PeerRecord>& peers, Clock::time_point deadline);

// Prints the message on stderr and ends every rank (MPI_Abort with exit code 124).
[[noreturn]] void abort_job(const std::string& message);

}  // namespace mt::parallel::mpi
