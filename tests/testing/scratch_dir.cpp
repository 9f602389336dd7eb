#include "tests/testing/scratch_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

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

}  // namespace mt::testing
