// runtime/core/determinism.h: deterministic algorithms are on by default, and the guard sets the
// process-wide mode for its scope, nested, then restores it (a thread started inside sees it).
#include "runtime/core/determinism.h"

#include <gtest/gtest.h>

#include <thread>

namespace mt::runtime {
namespace {

TEST(Determinism, OnByDefaultAndTheGuardRestoresIt) {
  EXPECT_TRUE(deterministic_algorithms());
  {
    DeterministicAlgorithmsGuard off(false);
    EXPECT_FALSE(deterministic_algorithms());
    bool seen_by_thread = true;
    std::thread([&] { seen_by_thread = deterministic_algorithms(); }).join();
    EXPECT_FALSE(seen_by_thread) << "the mode is the process's, not the thread's";
    {
      DeterministicAlgorithmsGuard on(true);
      EXPECT_TRUE(deterministic_algorithms());
    }
    EXPECT_FALSE(deterministic_algorithms());
  }
  EXPECT_TRUE(deterministic_algorithms());
}

}  // namespace
}  // namespace mt::runtime
