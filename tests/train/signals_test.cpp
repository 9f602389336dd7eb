// Clean stop on SIGINT/SIGTERM/SIGUSR1 (train/signals): the first signal only sets the flag, an
// immediate repeat is ignored, a later second SIGINT ends the process (checked in a death-test
// child) while a later SIGTERM or SIGUSR1 does not, handlers are restored on destruction, and only
// one StopRequest may exist at a time.
#include "train/signals.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "runtime/core/error.h"

namespace mt::train {
namespace {

using ::testing::HasSubstr;

TEST(StopRequest, SigintSetsTheFlag) {
  EXPECT_FALSE(stop_requested());  // none installed
  StopRequest stop;
  EXPECT_FALSE(stop.stop_requested());
  EXPECT_FALSE(stop_requested());
  ASSERT_EQ(std::raise(SIGINT), 0);  // handled: the test process survives
  EXPECT_TRUE(stop.stop_requested());
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop.signal_number(), SIGINT);
  stop.clear();
  EXPECT_FALSE(stop_requested());
  EXPECT_EQ(stop.signal_number(), 0);
}

TEST(StopRequest, SigtermSetsTheFlag) {
  StopRequest stop;
  ASSERT_EQ(std::raise(SIGTERM), 0);
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop.signal_number(), SIGTERM);
}

TEST(StopRequest, Sigusr1SetsTheFlag) {
  StopRequest stop;
  ASSERT_EQ(std::raise(SIGUSR1), 0);
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop.signal_number(), SIGUSR1);
  EXPECT_STREQ(stop.cause(), "SIGUSR1");
}

TEST(StopRequest, RequestStopWithoutSignal) {
  StopRequest stop;
  stop.request_stop();
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop.signal_number(), 0);
}

TEST(StopRequest, OnlyOneAtATime) {
  StopRequest stop;
  try {
    StopRequest second;
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("already installed"));
  }
  EXPECT_FALSE(stop_requested());  // the failed one changed nothing
}

TEST(StopRequest, RestoresPreviousHandlerOnDestruction) {
  struct sigaction before {};
  ASSERT_EQ(sigaction(SIGINT, nullptr, &before), 0);
  {
    StopRequest stop;
    struct sigaction during {};
    sigaction(SIGINT, nullptr, &during);
    EXPECT_NE(during.sa_handler, before.sa_handler);
  }
  struct sigaction after {};
  sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
  EXPECT_FALSE(stop_requested());
  // A new one can be installed again, and is fresh.
  StopRequest again;
  EXPECT_FALSE(again.stop_requested());
}

// `timeout -s INT` and some launchers deliver one stop twice (to the process and to its group):
// a repeat right after the first is not a second Ctrl-C.
TEST(StopRequest, ImmediateRepeatIsTheSameSignal) {
  StopRequest stop;
  ASSERT_EQ(std::raise(SIGINT), 0);
  ASSERT_EQ(std::raise(SIGINT), 0);  // would kill the test process if taken as a second Ctrl-C
  EXPECT_TRUE(stop.stop_requested());
  EXPECT_EQ(stop.signal_number(), SIGINT);
}

TEST(StopRequestDeathTest, SecondSigintExitsImmediately) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StopRequest stop;
        std::raise(SIGINT);
        if (!stop_requested()) std::_Exit(3);  // the first one must only set the flag
        std::this_thread::sleep_for(std::chrono::milliseconds(250));  // a deliberate second one
        std::raise(SIGINT);                                            // default action: killed
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "SIGINT received");
}

// SLURM's time limit: SIGUSR1 (--signal=USR1@SECONDS) first, SIGTERM at the limit, SIGKILL
// KillWait seconds later. The SIGTERM must not end the stop's checkpoint save; nor must a
// repeated SIGTERM (scancel twice).
TEST(StopRequestDeathTest, LaterSigtermOrSigusr1DoesNotEndTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StopRequest stop;
        std::raise(SIGUSR1);
        if (!stop_requested()) std::_Exit(3);
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        std::raise(SIGTERM);
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        std::raise(SIGTERM);
        std::raise(SIGUSR1);
        std::_Exit(stop.signal_number() == SIGUSR1 ? 7 : 4);  // still alive, first cause kept
      },
      ::testing::ExitedWithCode(7), "still stopping");
}

}  // namespace
}  // namespace mt::train
