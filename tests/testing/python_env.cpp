#include "tests/testing/python_env.h"

#include <cstdlib>

namespace mt::testing {

std::optional<std::string> python_with(const std::string& module) {
  for (const char* python : {"python3", "/usr/bin/python3"}) {
    const std::string command =
        std::string(python) + " -c 'import " + module + "' >/dev/null 2>&1";
    if (std::system(command.c_str()) == 0) return std::string(python);
  }
  return std::nullopt;
}

}  // namespace mt::testing
