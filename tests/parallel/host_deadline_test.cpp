// HostDeadline (parallel/comm/host_deadline.h): a call that returns in time ends nothing; one
// that is still blocked at the deadline ends the process with exit code 124 and a message naming
// it; timeout 0 means no limit.
#include "parallel/comm/host_deadline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace mt::parallel {
namespace {

using std::chrono::milliseconds;

TEST(HostDeadline, CallsThatReturnInTimeEndNothing) {
  for (int i = 0; i < 100; ++i) {
    HostDeadline deadline(milliseconds(5000), 0, "quick call");
  }
  {
    HostDeadline deadline(milliseconds(200), 0, "short wait");
    std::this_thread::sleep_for(milliseconds(20));
  }
  SUCCEED();  // the process is still here
}

TEST(HostDeadline, ZeroMeansNoLimit) {
  HostDeadline deadline(milliseconds(0), 0, "unlimited");
  std::this_thread::sleep_for(milliseconds(50));
  SUCCEED();
}

TEST(HostDeadlineDeathTest, ABlockedCallEndsTheJobNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        HostDeadline deadline(milliseconds(100), 3,
                              "ncclCommInitRank over group world (rank 3 of 4)");
        std::this_thread::sleep_for(std::chrono::seconds(30));  // a rank that never arrives
      },
      ::testing::ExitedWithCode(124),
      "\\[rank 3\\] collective timeout: ncclCommInitRank over group world \\(rank 3 of 4\\) did "
      "not return within 0.1 s");
}

}  // namespace
}  // namespace mt::parallel
