// Runs a shell command for end-to-end tests (tools, mpirun launches) and captures what it prints.
#pragma once

#include <string>

namespace mt::testing {

struct CommandResult {
  int status = -1;      // exit code; -1 when the command could not start or was killed
  std::string output;   // stdout and stderr, interleaved
  double seconds = 0;   // wall time
};

CommandResult run_command(const std::string& command);

}  // namespace mt::testing
