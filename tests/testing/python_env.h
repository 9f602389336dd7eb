// Finding a Python interpreter that has a given module, for tests that compare with Python tools
// (h5py, tokenizers). The `python3` on PATH may be a separate install (pyenv, venv) without
// Debian's python3-* packages, so /usr/bin/python3 is tried as well.
#pragma once

#include <optional>
#include <string>

namespace mt::testing {

// The first of `python3`, /usr/bin/python3 that can `import module`, or nullopt.
std::optional<std::string> python_with(const std::string& module);

}  // namespace mt::testing
