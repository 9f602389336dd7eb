// Message rounds: building them from unit-time starts, and checking that they pair and order.
#include "parallel/pipeline/message_rounds.h"

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "runtime/core/error.h"

namespace mt::parallel::pipeline {

namespace {

std::string describe(const StageMessage& m) {
  return detail::concat(m.gradient ? "the input gradient" : "the output", " of stage ",
                        m.from_stage, ", micro-batch ", m.microbatch, " (to stage ", m.to_stage(),
                        ")");
}

// The message `a` sends (its output or its input's gradient), if it goes to another stage.
std::optional<StageMessage> sent_by(const Action& a, int64_t last_stage) {
  if (a.kind == ActionKind::Forward && a.stage < last_stage)
    return StageMessage{a.stage, a.microbatch, false};
  if ((a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) && a.stage > 0)
    return StageMessage{a.stage, a.microbatch, true};
  return std::nullopt;
}

// The message `a` needs from another stage.
std::optional<StageMessage> received_by(const Action& a, int64_t last_stage) {
  if (a.kind == ActionKind::Forward && a.stage > 0)
    return StageMessage{a.stage - 1, a.microbatch, false};
  if ((a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) &&
      a.stage < last_stage)
    return StageMessage{a.stage + 1, a.microbatch, true};
  return std::nullopt;
}

int64_t sender(const StageMessage& m, int64_t pp) { return stage_rank(m.from_stage, pp); }
int64_t receiver(const StageMessage& m, int64_t pp) { return stage_rank(m.to_stage(), pp); }

// The messages of `round` between its rank and `peer`, in the round's order.
std::vector<StageMessage> with_peer(const MessageRound& round, int64_t rank, int64_t peer,
                                    int64_t pp) {
  std::vector<StageMessage> out;
  for (const StageMessage& m : round.messages) {
    const int64_t other = sender(m, pp) == rank ? receiver(m, pp) : sender(m, pp);
    if (other == peer) out.push_back(m);
  }
  return out;
}

// Where each rank's actions send and receive the crossing messages: the action's index.
struct ActionIndex {
  std::vector<std::map<StageMessage, size_t>> sends, receives;  // per rank
};

ActionIndex index_actions(const PipelineSchedule& s) {
  const int64_t last = s.num_stages() - 1;
  ActionIndex index{std::vector<std::map<StageMessage, size_t>>(s.ranks.size()),
                    std::vector<std::map<StageMessage, size_t>>(s.ranks.size())};
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const auto out = sent_by(s.ranks[r][i], last);
      if (out && receiver(*out, s.pp) != int64_t(r)) index.sends[r][*out] = i;
      const auto in = received_by(s.ranks[r][i], last);
      if (in && sender(*in, s.pp) != int64_t(r)) index.receives[r][*in] = i;
    }
  }
  return index;
}

}  // namespace

void check_message_rounds(const PipelineSchedule& s, const MessageRounds& rounds) {
  MT_CHECK(int64_t(rounds.size()) == s.pp, "message rounds: ", rounds.size(),
           " ranks' rounds for pp = ", s.pp);
  const ActionIndex actions = index_actions(s);
  std::map<StageMessage, int> posted;  // how often each crossing message is in a round
  for (const auto& sends : actions.sends)
    for (const auto& [m, i] : sends) posted[m] = 0;
  for (size_t r = 0; r < rounds.size(); ++r) {
    const int64_t rank = int64_t(r);
    for (size_t k = 0; k < rounds[r].size(); ++k) {
      const MessageRound& round = rounds[r][k];
      const std::string where =
          detail::concat("message rounds: rank ", r, "'s round at time ", round.time,
                         " (posted before action ", round.before_action, ")");
      MT_CHECK(k == 0 || (round.time > rounds[r][k - 1].time &&
                          round.before_action >= rounds[r][k - 1].before_action),
               where, " is not after its round at time ", rounds[r][k - 1].time,
               " (posted before action ", rounds[r][k - 1].before_action, ")");
      MT_CHECK(round.before_action <= s.ranks[r].size(), where, ": the rank has ",
               s.ranks[r].size(), " actions");
      for (const StageMessage& m : round.messages) {
        const bool sends = sender(m, s.pp) == rank;
        MT_CHECK(sends || receiver(m, s.pp) == rank, where, " holds ", describe(m),
                 ", which the rank neither sends nor receives");
        auto count = posted.find(m);
        MT_CHECK(count != posted.end(), where, " holds ", describe(m),
                 ", which no action sends to another rank");
        ++count->second;
        if (sends) {
          const size_t producer = actions.sends[r].at(m);
          MT_CHECK(producer < round.before_action, where, " sends ", describe(m),
                   " before its producer, action ", producer, " (", to_string(s.ranks[r][producer]),
                   "), runs");
        } else {
          auto consumer = actions.receives[r].find(m);
          MT_CHECK(consumer != actions.receives[r].end(), where, " receives ", describe(m),
                   ", which no action of the rank consumes");
          MT_CHECK(consumer->second >= round.before_action, where, " receives ", describe(m),
                   " after its consumer, action ", consumer->second, " (",
                   to_string(s.ranks[r][consumer->second]), "), runs");
        }
        const int64_t peer = sends ? receiver(m, s.pp) : sender(m, s.pp);
        const MessageRound* match = nullptr;
        for (const MessageRound& other : rounds[size_t(peer)])
          if (other.time == round.time) match = &other;
        MT_CHECK(match != nullptr &&
                     with_peer(*match, peer, rank, s.pp) == with_peer(round, rank, peer, s.pp),
                 where, " holds ", describe(m), " but rank ", peer,
                 "'s round at that time does not hold the messages between the two ranks in the "
                 "same order");
      }
    }
  }
  for (const auto& [m, count] : posted) {
    MT_CHECK(count == 2, "message rounds: ", describe(m), " is posted ", count,
             " times (once by its sender and once by its receiver expected)");
  }
}

MessageRounds message_rounds(const PipelineSchedule& schedule) {
  const auto start = unit_start_times(schedule);
  const int64_t last = schedule.num_stages() - 1;
  std::map<int64_t, std::vector<StageMessage>> by_time;  // sorted within each time below
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    for (size_t i = 0; i < schedule.ranks[r].size(); ++i) {
      const auto m = sent_by(schedule.ranks[r][i], last);
      if (!m || receiver(*m, schedule.pp) == int64_t(r)) continue;
      by_time[int64_t(start[r][i]) + 1].push_back(*m);
    }
  }
  MessageRounds rounds(schedule.ranks.size());
  for (auto& [time, messages] : by_time) {
    std::sort(messages.begin(), messages.end());
    std::map<int64_t, MessageRound> of_rank;
    for (const StageMessage& m : messages) {
      for (int64_t r : {sender(m, schedule.pp), receiver(m, schedule.pp)}) {
        MessageRound& round = of_rank[r];
        round.time = time;
        round.messages.push_back(m);
      }
    }
    for (auto& [r, round] : of_rank) {
      const auto& starts = start[size_t(r)];
      round.before_action =
          size_t(std::lower_bound(starts.begin(), starts.end(), double(time)) - starts.begin());
      rounds[size_t(r)].push_back(std::move(round));
    }
  }
  check_message_rounds(schedule, rounds);
  return rounds;
}

}  // namespace mt::parallel::pipeline
