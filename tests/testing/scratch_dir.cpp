#include "tests/testing/scratch_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <set>
#include <string>
#include <system_error>

namespace mt::testing {

ScratchDir::ScratchDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "_" + info->name() : "scratch";
  for (char& c : name) {
    if (c == '/') c = '_';  // parameterised test names
  }
  path_ = std::filesystem::temp_directory_path() /
          ("mt_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {

// The process_temp_dir roots, removed at exit.
struct ProcessTempRoots {
  std::set<std::filesystem::path> roots;
  ~ProcessTempRoots() {
    for (const std::filesystem::path& root : roots) {
      std::error_code ec;
      std::filesystem::remove_all(root, ec);
    }
  }
};

}  // namespace

std::filesystem::path process_temp_dir(const std::string& prefix, const std::string& name) {
  static ProcessTempRoots temp_roots;
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  temp_roots.roots.insert(root);
  const std::filesystem::path dir = root / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace mt::testing
