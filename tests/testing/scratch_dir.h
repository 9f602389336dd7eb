// Temporary folders the tests leave nothing behind in: ScratchDir, a fresh folder per test removed
// when the test ends (<tmp>/mt_<test suite>_<test>_<pid>), and process_temp_dir, named folders
// that live until the process exits.
#pragma once

#include <filesystem>
#include <string>

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

// <tmp>/<prefix>_<pid>/<name>, made empty now; the <prefix>_<pid> folder is removed when the
// process exits (for what several tests of one process share, such as a trained tokenizer).
std::filesystem::path process_temp_dir(const std::string& prefix, const std::string& name);

}  // namespace mt::testing
