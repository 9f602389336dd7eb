// popen-based command runner for tests (see run_command.h).
#include "tests/testing/run_command.h"

#include <sys/wait.h>

#include <chrono>
#include <cstdio>

namespace mt::testing {

CommandResult run_command(const std::string& command) {
  CommandResult r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace mt::testing
