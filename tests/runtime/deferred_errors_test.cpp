// The queue of verdicts that devices send back late (runtime/core/deferred_errors.h), driven by
// scripted verdicts: nothing is raised before a verdict arrives, the first failure in queue order
// is raised once with its op's message, verdicts still in flight stay queued, and a device error
// while polling drops only what was read. (The CUDA verdicts are tested in *_gpu_test.)
#include "runtime/core/deferred_errors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/core/error.h"
#include "tests/testing/errors.h"

namespace mt::runtime {
namespace {

struct Script {
  bool arrived = false;
  std::optional<BadElement> bad;
  bool device_error = false;  // arrived() throws, as a failed cudaEventQuery would
  int reads = 0;
};

class ScriptedVerdict final : public PendingVerdict {
 public:
  explicit ScriptedVerdict(Script* s) : s_(s) {}
  bool arrived() override {
    if (s_->device_error) MT_FAIL("device fault while polling");
    return s_->arrived;
  }
  std::optional<BadElement> bad_element() override {
    ++s_->reads;
    return s_->bad;
  }

 private:
  Script* s_;
};

void queue(Script* s, const std::string& op) {
  defer_verdict(std::make_unique<ScriptedVerdict>(s), [op](int64_t pos, int64_t value) {
    return op + ": value " + std::to_string(value) + " at " + std::to_string(pos);
  });
}

class DeferredErrors : public ::testing::Test {
 protected:
  void TearDown() override {
    // Leave an empty queue to the next test whatever happened.
    for (Script& s : scripts_) s = Script{true, std::nullopt, false, 0};
    raise_arrived_errors();
    ASSERT_EQ(pending_verdicts(), 0);
  }
  Script scripts_[4];
};

TEST_F(DeferredErrors, NothingIsRaisedBeforeTheVerdictArrives) {
  ASSERT_EQ(pending_verdicts(), 0);
  scripts_[0].bad = BadElement{3, 42};
  queue(&scripts_[0], "embedding");
  EXPECT_NO_THROW(raise_arrived_errors());
  EXPECT_EQ(pending_verdicts(), 1);
  EXPECT_EQ(scripts_[0].reads, 0);
  scripts_[0].arrived = true;
  EXPECT_THAT(testing::error_of([] { raise_arrived_errors(); }),
              ::testing::HasSubstr("embedding: value 42 at 3"));
  EXPECT_EQ(pending_verdicts(), 0);
  EXPECT_NO_THROW(raise_arrived_errors());  // raised once
  EXPECT_EQ(scripts_[0].reads, 1);
}

TEST_F(DeferredErrors, FirstFailureInQueueOrderWinsAndInFlightVerdictsStay) {
  queue(&scripts_[0], "a");
  queue(&scripts_[1], "b");
  queue(&scripts_[2], "c");
  queue(&scripts_[3], "d");
  scripts_[0] = Script{true, std::nullopt, false, 0};       // arrived, valid
  scripts_[1] = Script{true, BadElement{1, -1}, false, 0};  // arrived, bad
  scripts_[2] = Script{false, BadElement{0, 9}, false, 0};  // bad, still in flight
  scripts_[3] = Script{true, BadElement{5, 7}, false, 0};   // arrived, bad, later in the queue
  EXPECT_EQ(testing::error_of([] { raise_arrived_errors(); }), "b: value -1 at 1");
  EXPECT_EQ(pending_verdicts(), 1);  // only c: d's failure was read with b's and is not raised
  EXPECT_EQ(scripts_[3].reads, 1);
  scripts_[2].arrived = true;
  EXPECT_EQ(testing::error_of([] { raise_arrived_errors(); }), "c: value 9 at 0");
}

TEST_F(DeferredErrors, QueueingRaisesFailuresThatHaveArrived) {
  scripts_[0].bad = BadElement{2, 11};
  queue(&scripts_[0], "cross_entropy");
  scripts_[0].arrived = true;
  EXPECT_THAT(testing::error_of([&] { queue(&scripts_[1], "index_select"); }),
              ::testing::HasSubstr("cross_entropy: value 11 at 2"));
  EXPECT_EQ(pending_verdicts(), 1);  // the new verdict stays queued: its own failure is not lost
  scripts_[1].arrived = true;
  scripts_[1].bad = BadElement{4, 99};
  EXPECT_THAT(testing::error_of([] { raise_arrived_errors(); }),
              ::testing::HasSubstr("index_select: value 99 at 4"));
}

TEST_F(DeferredErrors, DeviceErrorWhilePollingDropsOnlyWhatWasRead) {
  queue(&scripts_[0], "a");
  queue(&scripts_[1], "b");
  queue(&scripts_[2], "c");
  scripts_[0].arrived = true;       // read before the fault
  scripts_[1].device_error = true;  // the fault
  EXPECT_THAT(testing::error_of([] { raise_arrived_errors(); }),
              ::testing::HasSubstr("device fault while polling"));
  EXPECT_EQ(pending_verdicts(), 2);
  EXPECT_EQ(scripts_[0].reads, 1);
}

TEST(DeferredErrorsArgs, RefusesAMissingVerdictOrMessage) {
  EXPECT_THAT(testing::error_of([] { defer_verdict(nullptr, [](int64_t, int64_t) {
                return std::string();
              }); }),
              ::testing::HasSubstr("expected a verdict and a message"));
}

}  // namespace
}  // namespace mt::runtime
