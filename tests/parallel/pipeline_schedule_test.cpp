// Pipeline schedules as data (parallel/pipeline/schedule.h): names, exact action orders (by hand
// for GPipe and 1F1B, torch's for the interleaved ones), completeness and deadlock checks, the
// timing simulation against the bubble formulas, the error messages and the rendered grid.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "parallel/pipeline/schedule.h"
#include "runtime/core/error.h"

namespace mt::parallel::pipeline {
namespace {

// Actions in torch's notation, "{stage}{F|B|I|W}{microbatch}", e.g. "0F1 1B0".
std::vector<Action> actions(const std::string& text) {
  std::vector<Action> out;
  std::istringstream is(text);
  std::string token;
  while (is >> token) {
    const size_t k = token.find_first_of("FBIW");
    const std::map<char, ActionKind> kinds = {{'F', ActionKind::Forward},
                                              {'B', ActionKind::Backward},
                                              {'I', ActionKind::BackwardInput},
                                              {'W', ActionKind::BackwardWeight}};
    out.push_back(
        {kinds.at(token[k]), std::stoll(token.substr(k + 1)), std::stoll(token.substr(0, k))});
  }
  return out;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

PipelineSchedule hand_made(ScheduleKind kind, int64_t pp, int64_t v, int64_t m,
                           const std::vector<std::string>& ranks) {
  PipelineSchedule s;
  s.kind = kind;
  s.pp = pp;
  s.stages_per_rank = v;
  s.microbatches = m;
  for (const std::string& r : ranks) s.ranks.push_back(actions(r));
  return s;
}

// What make_schedule should accept, restated from torch's and torchtitan's rules.
bool allowed(ScheduleKind kind, int64_t pp, int64_t v, int64_t m) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return v == 1;
    case ScheduleKind::OneFOneB:
      return v == 1 && m >= pp;
    default: {
      const int64_t rounds = std::max<int64_t>(1, m / pp);
      return v >= 2 && m % rounds == 0;
    }
  }
}

const ScheduleKind kKinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                               ScheduleKind::Interleaved1F1B, ScheduleKind::InterleavedZeroBubble};

TEST(ScheduleKindNames, RoundTripCaseInsensitivelyAndRejectUnknown) {
  for (ScheduleKind k : kKinds) EXPECT_EQ(parse_schedule_kind(schedule_kind_name(k)), k);
  EXPECT_STREQ(schedule_kind_name(ScheduleKind::OneFOneB), "1F1B");
  EXPECT_EQ(parse_schedule_kind("1f1b"), ScheduleKind::OneFOneB);  // torch matches any case
  EXPECT_EQ(parse_schedule_kind("interleavedzerobubble"), ScheduleKind::InterleavedZeroBubble);
  const std::string unknown = error_of([] { parse_schedule_kind("OneFOneB"); });
  EXPECT_NE(unknown.find("'OneFOneB'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble"), std::string::npos)
      << unknown;
  const std::string other = error_of([] { parse_schedule_kind("ZBVZeroBubble"); });
  EXPECT_NE(other.find("does not implement"), std::string::npos) << other;
  EXPECT_FALSE(is_interleaved(ScheduleKind::GPipe));
  EXPECT_FALSE(is_interleaved(ScheduleKind::OneFOneB));
  EXPECT_TRUE(is_interleaved(ScheduleKind::Interleaved1F1B));
  EXPECT_TRUE(is_interleaved(ScheduleKind::InterleavedZeroBubble));
  EXPECT_EQ(to_string({ActionKind::BackwardInput, 3, 5}), "BackwardInput(stage 5, mb 3)");
}

TEST(StageRank, LoopPlacement) {
  EXPECT_EQ(stage_rank(0, 4), 0);
  EXPECT_EQ(stage_rank(3, 4), 3);
  EXPECT_EQ(stage_rank(5, 4), 1);
  EXPECT_EQ(stage_rank(7, 1), 0);
  EXPECT_THROW(stage_rank(-1, 4), Error);
}

TEST(MakeSchedule, GPipeTwoRanksTwoMicrobatches) {
  const PipelineSchedule s = make_schedule(ScheduleKind::GPipe, 2, 1, 2);
  EXPECT_EQ(s.num_stages(), 2);
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_EQ(s.ranks[0], actions("0F0 0F1 0B0 0B1"));
  EXPECT_EQ(s.ranks[1], actions("1F0 1F1 1B0 1B1"));
}

TEST(MakeSchedule, OneFOneBByHand) {
  // pp - 1 - rank warm-up forwards, then forward/backward pairs, then the remaining backwards.
  const PipelineSchedule a = make_schedule(ScheduleKind::OneFOneB, 2, 1, 4);
  EXPECT_EQ(a.ranks[0], actions("0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3"));
  EXPECT_EQ(a.ranks[1], actions("1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3"));

  const PipelineSchedule b = make_schedule(ScheduleKind::OneFOneB, 4, 1, 4);
  EXPECT_EQ(b.ranks[0], actions("0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3"));
  EXPECT_EQ(b.ranks[1], actions("1F0 1F1 1F2 1B0 1F3 1B1 1B2 1B3"));
  EXPECT_EQ(b.ranks[2], actions("2F0 2F1 2B0 2F2 2B1 2F3 2B2 2B3"));
  EXPECT_EQ(b.ranks[3], actions("3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3"));
}

// The expected orders are torch 2.15's (ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble
// pipeline_order for pp 2, 2 stages per rank, 4 micro-batches, printed by torch, idle slots
// dropped). The same comparison over pp 1..4, v 2..3, m 1..16 was made when this was written.
TEST(MakeSchedule, InterleavedMatchesTorch) {
  const PipelineSchedule s = make_schedule(ScheduleKind::Interleaved1F1B, 2, 2, 4);
  EXPECT_EQ(s.ranks[0], actions("0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3"));
  EXPECT_EQ(s.ranks[1], actions("1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3"));

  const PipelineSchedule z = make_schedule(ScheduleKind::InterleavedZeroBubble, 2, 2, 4);
  EXPECT_EQ(z.ranks[0], actions("0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 "
                                "2F3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3"));
  EXPECT_EQ(z.ranks[1], actions("1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 "
                                "1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3"));
}

// Every schedule make_schedule accepts is complete and valid, and refused exactly where the rules
// say; per stage, backwards (and weight actions) run micro-batches in increasing order.
TEST(MakeSchedule, EveryAllowedScheduleValidatesWithOrderedBackwards) {
  int built = 0;
  for (ScheduleKind kind : kKinds) {
    for (int64_t pp : {1, 2, 4}) {
      for (int64_t v : {1, 2, 3}) {
        for (int64_t m = 1; m <= 12; ++m) {
          SCOPED_TRACE(testing::Message()
                       << schedule_kind_name(kind) << " pp " << pp << " v " << v << " m " << m);
          if (!allowed(kind, pp, v, m)) {
            EXPECT_THROW(make_schedule(kind, pp, v, m), Error);
            continue;
          }
          const PipelineSchedule s = make_schedule(kind, pp, v, m);
          ++built;
          EXPECT_NO_THROW(validate_schedule(s));
          const bool split = kind == ScheduleKind::InterleavedZeroBubble;
          std::map<std::pair<ActionKind, int64_t>, int64_t> next;  // (kind, stage) -> next mb
          for (int64_t r = 0; r < pp; ++r) {
            EXPECT_EQ(int64_t(s.ranks[size_t(r)].size()), (split ? 3 : 2) * v * m);
            for (const Action& a : s.ranks[size_t(r)]) {
              EXPECT_EQ(stage_rank(a.stage, pp), r);
              if (split) {
                EXPECT_NE(a.kind, ActionKind::Backward);
              } else {
                EXPECT_NE(a.kind, ActionKind::BackwardInput);
                EXPECT_NE(a.kind, ActionKind::BackwardWeight);
              }
              if (a.kind != ActionKind::Forward) {
                const int64_t expected = next[std::make_pair(a.kind, a.stage)]++;
                EXPECT_EQ(a.microbatch, expected) << to_string(a);
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(built, 60);
}

TEST(SimulateSchedule, GPipeTimesByHand) {
  const ScheduleTiming t = simulate_schedule(make_schedule(ScheduleKind::GPipe, 2, 1, 2));
  EXPECT_EQ(t.makespan, 9);
  EXPECT_EQ(t.busy, (std::vector<double>{6, 6}));
  EXPECT_EQ(t.start[0], (std::vector<double>{0, 1, 5, 7}));
  EXPECT_EQ(t.start[1], (std::vector<double>{1, 2, 3, 5}));
  const ScheduleTiming slow_backward =
      simulate_schedule(make_schedule(ScheduleKind::GPipe, 2, 1, 2), 1, 4);
  EXPECT_EQ(slow_backward.makespan, 3 + 4 * 3);
}

TEST(SimulateSchedule, GPipeAndOneFOneBBubbleIsTheFormulaExactly) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
    for (int64_t pp : {1, 2, 3, 4, 8}) {
      for (int64_t m = pp; m <= 4 * pp; ++m) {
        const ScheduleTiming t = simulate_schedule(make_schedule(kind, pp, 1, m));
        const double expected = double(pp - 1) / double(m + pp - 1);
        EXPECT_EQ(theoretical_bubble_fraction(kind, pp, 1, m), expected);
        EXPECT_EQ(t.makespan, 3.0 * double(m + pp - 1));
        for (double b : t.bubble_fraction) {
          EXPECT_EQ(b, expected) << schedule_kind_name(kind) << " pp " << pp << " m " << m;
        }
      }
    }
  }
}

TEST(SimulateSchedule, InterleavedBubblesAreTheFormulasAndBeatOneFOneB) {
  for (int64_t pp : {2, 4, 8}) {
    for (int64_t v : {2, 3}) {
      for (int64_t m : {pp, 2 * pp, 3 * pp}) {
        SCOPED_TRACE(testing::Message() << "pp " << pp << " v " << v << " m " << m);
        const double one_f_one_b =
            simulate_schedule(make_schedule(ScheduleKind::OneFOneB, pp, 1, m)).bubble_fraction[0];
        const ScheduleTiming il =
            simulate_schedule(make_schedule(ScheduleKind::Interleaved1F1B, pp, v, m));
        const ScheduleTiming zb =
            simulate_schedule(make_schedule(ScheduleKind::InterleavedZeroBubble, pp, v, m));
        EXPECT_DOUBLE_EQ(theoretical_bubble_fraction(ScheduleKind::Interleaved1F1B, pp, v, m),
                         double(pp - 1) / double(v * m + pp - 1));
        for (int64_t r = 0; r < pp; ++r) {
          EXPECT_DOUBLE_EQ(il.bubble_fraction[size_t(r)],
                           theoretical_bubble_fraction(ScheduleKind::Interleaved1F1B, pp, v, m));
          EXPECT_DOUBLE_EQ(
              zb.bubble_fraction[size_t(r)],
              theoretical_bubble_fraction(ScheduleKind::InterleavedZeroBubble, pp, v, m));
          EXPECT_LT(il.bubble_fraction[size_t(r)], one_f_one_b);
          EXPECT_LT(zb.bubble_fraction[size_t(r)], il.bubble_fraction[size_t(r)]);
        }
      }
    }
  }
  // Where m is not a multiple of pp the orders still run, and zero bubble still wins.
  for (int64_t m : {3, 5, 6, 7}) {
    const auto il = simulate_schedule(make_schedule(ScheduleKind::Interleaved1F1B, 4, 2, m));
    const auto zb = simulate_schedule(make_schedule(ScheduleKind::InterleavedZeroBubble, 4, 2, m));
    EXPECT_LT(zb.makespan, il.makespan) << "m " << m;
  }
}

TEST(ValidateSchedule, RejectsACrossRankDeadlockNamingTheStuckActions) {
  // Rank 0 first waits for stage 1 (rank 1), which first waits for stage 0 (rank 0, later).
  const PipelineSchedule s =
      hand_made(ScheduleKind::Interleaved1F1B, 2, 2, 1, {"2F0 0F0 2B0 0B0", "1F0 3F0 3B0 1B0"});
  const std::string msg = error_of([&] { validate_schedule(s); });
  EXPECT_NE(msg.find("deadlocks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 is stuck at action 0, Forward(stage 2, mb 0): it waits for "
                     "Forward(stage 1, mb 0) on rank 1"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rank 1 is stuck at action 0, Forward(stage 1, mb 0): it waits for "
                     "Forward(stage 0, mb 0) on rank 0"),
            std::string::npos)
      << msg;
  EXPECT_THROW(simulate_schedule(s), Error);
}

TEST(ValidateSchedule, RejectsOrderErrorsOnOneRank) {
  // Backward before its forward on rank 1; rank 0 then waits for that backward.
  const std::string b = error_of([] {
    validate_schedule(hand_made(ScheduleKind::GPipe, 2, 1, 1, {"0F0 0B0", "1B0 1F0"}));
  });
  EXPECT_NE(b.find("rank 1 is stuck at action 0, Backward(stage 1, mb 0): it waits for "
                   "Forward(stage 1, mb 0), which this rank runs only later"),
            std::string::npos)
      << b;
  EXPECT_NE(b.find("rank 0 is stuck at action 1, Backward(stage 0, mb 0)"), std::string::npos) << b;
  // A weight gradient before its input gradient.
  const std::string w = error_of([] {
    validate_schedule(
        hand_made(ScheduleKind::InterleavedZeroBubble, 1, 2, 1, {"0F0 1F0 1I0 0W0 0I0 1W0"}));
  });
  EXPECT_NE(w.find("BackwardWeight(stage 0, mb 0): it waits for BackwardInput(stage 0, mb 0), "
                   "which this rank runs only later"),
            std::string::npos)
      << w;
}

TEST(ValidateSchedule, RejectsIncompleteOrMisplacedSchedules) {
  PipelineSchedule s = make_schedule(ScheduleKind::OneFOneB, 2, 1, 2);
  s.ranks[1].pop_back();  // 1B1
  std::string msg = error_of([&] { validate_schedule(s); });
  EXPECT_NE(msg.find("not complete"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage 1 mb 1 has no backward"), std::string::npos) << msg;

  PipelineSchedule z = make_schedule(ScheduleKind::InterleavedZeroBubble, 2, 2, 2);
  z.ranks[0].pop_back();  // the last BackwardWeight of rank 0
  msg = error_of([&] { validate_schedule(z); });
  EXPECT_NE(msg.find("BackwardWeight(stage 0, mb 1) is missing"), std::string::npos) << msg;

  PipelineSchedule d = make_schedule(ScheduleKind::GPipe, 2, 1, 2);
  d.ranks[0].push_back({ActionKind::Forward, 0, 0});
  msg = error_of([&] { validate_schedule(d); });
  EXPECT_NE(msg.find("Forward(stage 0, mb 0) appears 2 times"), std::string::npos) << msg;

  PipelineSchedule p = make_schedule(ScheduleKind::GPipe, 2, 1, 1);
  std::swap(p.ranks[0], p.ranks[1]);
  msg = error_of([&] { validate_schedule(p); });
  EXPECT_NE(msg.find("rank 0 action 0, Forward(stage 1, mb 0), belongs on rank 1"),
            std::string::npos)
      << msg;

  PipelineSchedule o = make_schedule(ScheduleKind::GPipe, 2, 1, 1);
  o.ranks[1].push_back({ActionKind::Forward, 5, 1});
  msg = error_of([&] { validate_schedule(o); });
  EXPECT_NE(msg.find("Forward(stage 1, mb 5), is outside"), std::string::npos) << msg;

  PipelineSchedule n = make_schedule(ScheduleKind::GPipe, 2, 1, 1);
  n.ranks.pop_back();
  msg = error_of([&] { validate_schedule(n); });
  EXPECT_NE(msg.find("lists 1 ranks' actions, expected pp = 2"), std::string::npos) << msg;
}

TEST(MakeSchedule, ErrorsNameTheNumbers) {
  auto msg = [](ScheduleKind k, int64_t pp, int64_t v, int64_t m) {
    return error_of([&] { make_schedule(k, pp, v, m); });
  };
  EXPECT_NE(msg(ScheduleKind::GPipe, 0, 1, 4).find("pp must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(msg(ScheduleKind::GPipe, 2, 1, 0).find("microbatches must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(msg(ScheduleKind::GPipe, 2, 2, 4).find("got stages_per_rank 2"), std::string::npos);
  const std::string v1 = msg(ScheduleKind::InterleavedZeroBubble, 2, 1, 4);
  EXPECT_NE(v1.find("needs stages_per_rank >= 2"), std::string::npos) << v1;
  EXPECT_NE(v1.find("got 1"), std::string::npos) << v1;
  const std::string few = msg(ScheduleKind::OneFOneB, 4, 1, 3);
  EXPECT_NE(few.find("needs microbatches >= pp"), std::string::npos) << few;
  EXPECT_NE(few.find("got microbatches 3 with pp 4"), std::string::npos) << few;
  const std::string rounds = msg(ScheduleKind::Interleaved1F1B, 2, 2, 5);
  EXPECT_NE(rounds.find("= 2"), std::string::npos) << rounds;
  EXPECT_NE(rounds.find("got microbatches 5 with pp 2"), std::string::npos) << rounds;
}

TEST(RenderSchedule, GPipeTwoRanksTwoMicrobatches) {
  EXPECT_EQ(render_schedule(make_schedule(ScheduleKind::GPipe, 2, 1, 2)),
            "GPipe pp=2 v=1 microbatches=2 makespan=9 (f=1 b=2 i=1 w=1) bubble: r0=0.333 "
            "r1=0.333\n"
            "rank 0 | F0 F1 .  .  .  B0 B0 B1 B1\n"
            "rank 1 | .  F0 F1 B0 B0 B1 B1 .  .\n");
}

TEST(RenderSchedule, InterleavedShowsStagesAndWrapsLongRows) {
  const std::string zb =
      render_schedule(make_schedule(ScheduleKind::InterleavedZeroBubble, 2, 2, 2));
  EXPECT_EQ(zb,
            "InterleavedZeroBubble pp=2 v=2 microbatches=2 makespan=13 (f=1 b=2 i=1 w=1) bubble: "
            "r0=0.077 r1=0.077\n"
            "rank 0 | F0.s0 F1.s0 F0.s2 F1.s2 .     I0.s2 W0.s2 I1.s2 W1.s2 I0.s0 W0.s0 I1.s0 "
            "W1.s0\n"
            "rank 1 | .     F0.s1 F1.s1 F0.s3 I0.s3 F1.s3 I1.s3 W0.s3 I0.s1 W1.s3 I1.s1 W0.s1 "
            "W1.s1\n");
  const std::string wide = render_schedule(make_schedule(ScheduleKind::Interleaved1F1B, 4, 2, 8));
  EXPECT_EQ(wide.find("t 0..21:\nrank 0 | F0.s0 F1.s0"), wide.find('\n') + 1) << wide;
  EXPECT_NE(wide.find("\n\nt 22..43:\n"), std::string::npos) << wide;
  std::istringstream lines(wide);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("rank", 0) == 0) {
      EXPECT_LE(line.size(), 140u) << line;
    }
  }
}

}  // namespace
}  // namespace mt::parallel::pipeline
