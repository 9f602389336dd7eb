// Locating ../shared/data (real data for tests: corpus, GPT-2 tokenizer, MovieLens) and skipping
// tests cleanly where it is absent. $MT_SHARED_DATA wins; otherwise the folder is looked up beside
// the repository, from the working directory and from this source tree.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>

namespace mt::testing {

std::optional<std::filesystem::path> shared_data();

}  // namespace mt::testing

// Declares `var` as the path of `relative` inside the shared data, or skips the test with a
// message saying what is missing.
#define REQUIRE_SHARED_FILE(var, relative)                                                      \
  const std::optional<std::filesystem::path> var##_dir = ::mt::testing::shared_data();         \
  if (!var##_dir || !std::filesystem::exists(*var##_dir / (relative))) {                        \
    GTEST_SKIP() << "shared data file " << (relative)                                           \
                 << " not found (set MT_SHARED_DATA or put shared/data beside the repository)"; \
  }                                                                                             \
  const std::filesystem::path var = *var##_dir / (relative)
