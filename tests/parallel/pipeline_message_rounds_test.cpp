// Message rounds (parallel/pipeline/message_rounds.h): the rounds of a 1F1B schedule by hand,
// every schedule's rounds pairing up on both ends, and the checks that reject rounds which could
// deadlock or lose a message.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "parallel/pipeline/message_rounds.h"
#include "runtime/core/error.h"
#include "tests/testing/errors.h"

namespace mt::parallel::pipeline {
namespace {

StageMessage activation(int64_t from, int64_t mb) { return {from, mb, false}; }
StageMessage gradient(int64_t from, int64_t mb) { return {from, mb, true}; }

void expect_round(const MessageRound& round, int64_t time, size_t before,
                  const std::vector<StageMessage>& messages) {
  EXPECT_EQ(round.time, time);
  EXPECT_EQ(round.before_action, before) << "round at time " << time;
  EXPECT_EQ(round.messages, messages) << "round at time " << time;
}

// 1F1B, pp 2, 2 micro-batches. Rank 0 runs F0 F1 B0 B1, rank 1 F0 B0 F1 B1; in unit time rank 0's
// start at 0 1 3 5 and rank 1's at 1 2 3 4. Activation 0 is produced at 1, activation 1 at 2,
// gradient 0 at 3 (rank 1's B0 ends), gradient 1 at 5.
TEST(MessageRounds, OneFOneBTwoRanksByHand) {
  const PipelineSchedule s = make_schedule(ScheduleKind::OneFOneB, 2, 1, 2);
  const MessageRounds rounds = message_rounds(s);
  ASSERT_EQ(rounds.size(), 2u);
  ASSERT_EQ(rounds[0].size(), 4u);
  ASSERT_EQ(rounds[1].size(), 4u);
  // Rank 0 sends activation 1 right after F1 (before B0, its action 2), and posts the receive of
  // gradient 0 there too; gradient 1 before B1.
  expect_round(rounds[0][0], 1, 1, {activation(0, 0)});
  expect_round(rounds[0][1], 2, 2, {activation(0, 1)});
  expect_round(rounds[0][2], 3, 2, {gradient(1, 0)});
  expect_round(rounds[0][3], 5, 3, {gradient(1, 1)});
  // Rank 1 receives activation 1 before B0, one action ahead of F1; sends gradient 1 at the end.
  expect_round(rounds[1][0], 1, 0, {activation(0, 0)});
  expect_round(rounds[1][1], 2, 1, {activation(0, 1)});
  expect_round(rounds[1][2], 3, 2, {gradient(1, 0)});
  expect_round(rounds[1][3], 5, 4, {gradient(1, 1)});
}

// Every schedule make_schedule accepts (pp 2 to 4) and its Forward-only projection (evaluation):
// each crossing message is posted twice (sender and receiver), and check_message_rounds passed
// inside message_rounds.
TEST(MessageRounds, EveryScheduleAndItsForwardsPostEachMessageOnBothEnds) {
  int checked = 0;
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                            ScheduleKind::Interleaved1F1B, ScheduleKind::InterleavedZeroBubble}) {
    for (int64_t pp = 2; pp <= 4; ++pp) {
      for (int64_t v : {1, 2, 3}) {
        for (int64_t m : {int64_t(1), pp - 1, pp, pp + 1, 2 * pp, 3 * pp}) {
          if (m < 1) continue;
          PipelineSchedule s;
          try {
            s = make_schedule(kind, pp, v, m);
          } catch (const Error&) {
            continue;  // not a schedule torch runs (pipeline_schedule_test covers which)
          }
          const std::string what = std::string(schedule_kind_name(kind)) + " pp " +
                                   std::to_string(pp) + " v " + std::to_string(v) + " m " +
                                   std::to_string(m);
          auto posted = [](const MessageRounds& rounds) {
            size_t n = 0;
            for (const auto& rank : rounds)
              for (const MessageRound& r : rank) n += r.messages.size();
            return n;
          };
          // pp >= 2: every stage boundary crosses ranks, once forward and once backward per mb.
          const size_t crossing = size_t((s.num_stages() - 1) * m);
          EXPECT_EQ(posted(message_rounds(s)), 2 * 2 * crossing) << what;
          PipelineSchedule forwards = s;
          for (auto& actions : forwards.ranks)
            std::erase_if(actions, [](const Action& a) { return a.kind != ActionKind::Forward; });
          EXPECT_EQ(posted(message_rounds(forwards)), 2 * crossing) << what;
          ++checked;
        }
      }
    }
  }
  EXPECT_GE(checked, 40);
}

// Rounds that would deadlock on in-order streams, or lose a message, are errors naming it.
TEST(MessageRounds, CheckRejectsRoundsThatCouldDeadlockOrLoseAMessage) {
  const PipelineSchedule s = make_schedule(ScheduleKind::OneFOneB, 2, 1, 2);
  const MessageRounds good = message_rounds(s);
  auto check = [&](const std::function<void(MessageRounds&)>& mutate) {
    MessageRounds r = good;
    mutate(r);
    return testing::error_of([&] { check_message_rounds(s, r); });
  };
  EXPECT_NO_THROW(check_message_rounds(s, good));
  // Activation 1 sent before F1 ran.
  EXPECT_NE(check([](MessageRounds& r) { r[0][1].before_action = 1; })
                .find("sends the output of stage 0, micro-batch 1 (to stage 1) before its "
                      "producer, action 1 (Forward(stage 0, mb 1)), runs"),
            std::string::npos);
  // Activation 0 received only after F0 on rank 1 needed it.
  EXPECT_NE(check([](MessageRounds& r) { r[1][0].before_action = 1; })
                .find("receives the output of stage 0, micro-batch 0 (to stage 1) after its "
                      "consumer, action 0"),
            std::string::npos);
  // Rank 0 posts gradient 0's round before activation 1's: out of order.
  EXPECT_NE(check([](MessageRounds& r) {
              std::swap(r[0][1], r[0][2]);
            }).find("is not after its round at time 3"),
            std::string::npos);
  // The two ends disagree on a round.
  EXPECT_NE(check([](MessageRounds& r) {
              r[0][3].time = 6;
            }).find("does not hold the messages between the two ranks in the same order"),
            std::string::npos);
  // A message neither end posts.
  EXPECT_NE(check([](MessageRounds& r) {
              r[0][3].messages.clear();
              r[1][3].messages.clear();
            }).find("the input gradient of stage 1, micro-batch 1 (to stage 0) is posted 0 times"),
            std::string::npos);
  EXPECT_NE(check([](MessageRounds& r) { r.pop_back(); }).find("1 ranks' rounds for pp = 2"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::parallel::pipeline
