// Clean stop on Ctrl-C: while a StopRequest is alive, the first SIGINT, SIGTERM or SIGUSR1 only
// sets a flag (the trainer checks stop_requested() at the end of each step, saves what it must and
// says where it stopped), and prints a short note to stderr. SIGUSR1 is the warning a scheduler
// sends before it preempts the job or its time runs out (SLURM's sbatch --signal=USR1@SECONDS):
// the same stop, which the trainer may follow with a requeue ([job] requeue_on_preemption).
// While a stop is pending, a second Ctrl-C (SIGINT) gets the default action and ends the process
// at once; a SIGTERM or SIGUSR1 is only noted, so that a scheduler's SIGTERM at the time limit,
// after its warning, does not cut the stop's checkpoint short (its SIGKILL, KillWait seconds
// later, is the hard end). A repeat within 200 ms of the first is taken as the same signal
// delivered twice (`timeout` and some launchers signal the process and its process group) and
// ignored. Destroying the StopRequest restores the handlers that were there before.
//
// The handler only reads the monotonic clock, stores to lock-free atomics and calls write(2),
// signal(2) and raise(3), all async-signal-safe. One StopRequest may be installed at a time (a
// second one throws). In a multi-rank run each rank sees its own signal; the trainer must agree
// on the stop step across ranks (e.g. an all-reduce of the flag) before acting on it.
#pragma once

namespace mt::train {

class StopRequest {
 public:
  StopRequest();  // installs the SIGINT, SIGTERM and SIGUSR1 handlers; throws mt::Error if one is
                  // installed
  ~StopRequest();
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;

  bool stop_requested() const;
  // The signal that asked to stop (SIGINT, SIGTERM, SIGUSR1), or 0 (also after request_stop()).
  int signal_number() const;
  // "SIGINT", "SIGTERM", "SIGUSR1" or "a stop request", for the log.
  const char* cause() const;
  // Asks to stop without a signal (e.g. another rank asked) / forgets a request.
  void request_stop();
  void clear();
};

// Whether a stop was requested (false when no StopRequest is installed).
bool stop_requested();

}  // namespace mt::train
