// A fresh temporary folder per test, removed when the test ends: <tmp>/mt_<test suite>_<test>_<pid>.
#pragma once

#include <filesystem>

namespace mt::testing {

class ScratchDir {
 public:
  ScratchDir();  // named after the running GoogleTest test
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::filesystem::path& p) const { return path_ / p; }

 private:
  std::filesystem::path path_;
};

}  // namespace mt::testing
