#include "parallel/comm/host_deadline.h"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "parallel/comm/mpi_runtime.h"
#include "runtime/core/error.h"

namespace mt::parallel {

void end_job_now(int rank, const std::string& message) {
  if (mpi::active()) mpi::abort_job(message);
  std::fprintf(stderr, "[rank %d] %s\n", rank, message.c_str());
  std::fflush(stderr);
  std::_Exit(124);
}

struct HostDeadline::State {
  std::mutex mutex;
  std::condition_variable cv;
  bool returned = false;
};

HostDeadline::HostDeadline(std::chrono::milliseconds timeout, int rank, std::string what) {
  if (timeout.count() <= 0) return;
  state_ = std::make_shared<State>();
  clock_ = std::thread([state = state_, timeout, rank, what = std::move(what)] {
    std::unique_lock lock(state->mutex);
    if (state->cv.wait_for(lock, timeout, [&] { return state->returned; })) return;
    end_job_now(rank, detail::concat("collective timeout: ", what, " did not return within ",
                                     double(timeout.count()) / 1000.0,
                                     " s ([comm] timeout_seconds). It waits for every rank of "
                                     "the group: a rank did not reach it, or cannot reach this "
                                     "one.\nEnding every rank of the job."));
  });
}

HostDeadline::~HostDeadline() {
  if (!state_) return;
  {
    std::lock_guard lock(state_->mutex);
    state_->returned = true;
  }
  state_->cv.notify_one();
  clock_.join();
}

}  // namespace mt::parallel
