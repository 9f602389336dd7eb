#include "train/signals.h"

#include <signal.h>
#include <unistd.h>

#include <time.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "runtime/core/error.h"

namespace mt::train {

namespace {
std::atomic<bool> g_installed{false};
std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
std::atomic<int64_t> g_first_ns{0};  // when the signal that asked to stop arrived
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free &&
                  std::atomic<int64_t>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

// A repeat closer than this to the first signal is the same event delivered twice (coreutils'
// timeout and some launchers signal both the process and its process group), not a second
// Ctrl-C.
constexpr int64_t kDuplicateWindowNs = 200'000'000;

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct sigaction g_old_int, g_old_term, g_old_usr1;

void write_stderr(const char* s) {
  // Async-signal-safe; the result is deliberately ignored (nothing to do if stderr is closed).
  const ssize_t r = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)r;
}

extern "C" void on_stop_signal(int sig) {
  const int saved_errno = errno;
  const int64_t now = monotonic_ns();
  if (g_signal.load(std::memory_order_relaxed) != 0) {  // a signal already asked to stop
    if (now - g_first_ns.load(std::memory_order_relaxed) < kDuplicateWindowNs) {
      errno = saved_errno;  // the same signal delivered twice
      return;
    }
    if (sig == SIGINT) {
      // A second, deliberate Ctrl-C: the default action (blocked until this handler returns).
      signal(sig, SIG_DFL);
      raise(sig);
    } else {
      // A scheduler's SIGTERM after its warning (time limit after --signal=USR1@...) or a
      // repeated one: the stop (and its checkpoint) goes on; the scheduler's SIGKILL ends it.
      write_stderr("\nminititan: another stop signal received; still stopping at the end of "
                   "this step and saving\n");
    }
    errno = saved_errno;
    return;
  }
  g_first_ns.store(now, std::memory_order_relaxed);
  g_signal.store(sig, std::memory_order_relaxed);
  g_stop.store(true, std::memory_order_release);
  write_stderr(sig == SIGINT    ? "\nminititan: SIGINT received, stopping at the end of this step "
                                  "(press Ctrl-C again to exit now)\n"
               : sig == SIGUSR1 ? "\nminititan: SIGUSR1 received (a preemption or time-limit "
                                  "warning), stopping at the end of this step\n"
                                : "\nminititan: SIGTERM received, stopping at the end of this "
                                  "step\n");
  errno = saved_errno;
}
}  // namespace

StopRequest::StopRequest() {
  bool expected = false;
  MT_CHECK(g_installed.compare_exchange_strong(expected, true),
           "StopRequest: a StopRequest is already installed (only one may exist at a time)");
  g_stop.store(false);
  g_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // the handler itself gives a second signal the default action
  if (sigaction(SIGINT, &sa, &g_old_int) != 0) {
    g_installed.store(false);
    MT_FAIL("StopRequest: cannot install the SIGINT handler: ", std::strerror(errno));
  }
  if (sigaction(SIGTERM, &sa, &g_old_term) != 0) {
    const int err = errno;
    sigaction(SIGINT, &g_old_int, nullptr);
    g_installed.store(false);
    MT_FAIL("StopRequest: cannot install the SIGTERM handler: ", std::strerror(err));
  }
  if (sigaction(SIGUSR1, &sa, &g_old_usr1) != 0) {
    const int err = errno;
    sigaction(SIGINT, &g_old_int, nullptr);
    sigaction(SIGTERM, &g_old_term, nullptr);
    g_installed.store(false);
    MT_FAIL("StopRequest: cannot install the SIGUSR1 handler: ", std::strerror(err));
  }
}

StopRequest::~StopRequest() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
  g_stop.store(false);
  g_signal.store(0);
  g_installed.store(false);
}

bool StopRequest::stop_requested() const { return g_stop.load(std::memory_order_acquire); }
int StopRequest::signal_number() const { return g_signal.load(std::memory_order_relaxed); }

const char* StopRequest::cause() const {
  const int sig = signal_number();
  return sig == SIGINT    ? "SIGINT"
         : sig == SIGTERM ? "SIGTERM"
         : sig == SIGUSR1 ? "SIGUSR1"
                          : "a stop request";
}
void StopRequest::request_stop() { g_stop.store(true, std::memory_order_release); }
void StopRequest::clear() {
  g_stop.store(false);
  g_signal.store(0);
}

bool stop_requested() {
  return g_installed.load(std::memory_order_acquire) && g_stop.load(std::memory_order_acquire);
}

}  // namespace mt::train
