#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <sstream>

#include "runtime/core/error.h"

namespace mt::parallel::pipeline {

namespace {

constexpr std::array<ScheduleKind, 4> kAllKinds = {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                                                   ScheduleKind::Interleaved1F1B,
                                                   ScheduleKind::InterleavedZeroBubble};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string describe(const PipelineSchedule& s) {
  return detail::concat(schedule_kind_name(s.kind), " (pp ", s.pp, ", stages_per_rank ",
                        s.stages_per_rank, ", microbatches ", s.microbatches, ")");
}

// ---------------------------------------------------------------------------------------------
// Builders. Each returns rank r's actions in torch's order (its None slots dropped).

std::vector<Action> gpipe_rank(int64_t rank, int64_t m) {
  std::vector<Action> ops;
  for (int64_t i = 0; i < m; ++i) ops.push_back({ActionKind::Forward, i, rank});
  for (int64_t i = 0; i < m; ++i) ops.push_back({ActionKind::Backward, i, rank});
  return ops;
}

// torch's Schedule1F1B: pp - rank forwards, then backward/forward pairs, then the remaining
// backwards; the same sequence as pp - 1 - rank warm-up forwards, then forward/backward pairs.
std::vector<Action> one_f_one_b_rank(int64_t rank, int64_t pp, int64_t m) {
  const int64_t warmup = std::min(m, pp - 1 - rank);
  std::vector<Action> ops;
  for (int64_t i = 0; i < warmup; ++i) ops.push_back({ActionKind::Forward, i, rank});
  for (int64_t i = warmup; i < m; ++i) {
    ops.push_back({ActionKind::Forward, i, rank});
    ops.push_back({ActionKind::Backward, i - warmup, rank});
  }
  for (int64_t i = m - warmup; i < m; ++i) ops.push_back({ActionKind::Backward, i, rank});
  return ops;
}

// torch's _get_1f1b_rank_ops with the stage-index functions of ScheduleInterleaved1F1B
// (zero_bubble false, warm-up factor 2) and ScheduleInterleavedZeroBubble (true, factor 1).
std::vector<Action> interleaved_rank(int64_t rank, int64_t pp, int64_t v, int64_t m,
                                     bool zero_bubble) {
  const int64_t rounds = std::max<int64_t>(1, m / pp);
  const int64_t per_round = m / rounds;
  const int64_t factor = zero_bubble ? 1 : 2;
  // The last rank's warm-up covers the first v-1 chunks of a round; each hop back adds `factor`.
  const int64_t warmup = std::min((v - 1) * per_round + factor * (pp - 1 - rank), m * v);
  const int64_t fwd_bwd = m * v - warmup;
  const int64_t total = warmup + fwd_bwd + warmup;  // the cool-down has `warmup` backwards
  // Forwards walk the chunks 0..v-1 round by round; backwards walk them from v-1 down.
  auto forward_stage = [&](int64_t step) { return ((step / per_round) % v) * pp + rank; };
  auto backward_stage = [&](int64_t step) {
    return (v - 1 - ((step - warmup) / per_round) % v) * pp + rank;
  };
  const ActionKind backward = zero_bubble ? ActionKind::BackwardInput : ActionKind::Backward;
  // Next micro-batch per stage for each action kind; a stage's actions of one kind therefore run
  // micro-batches in increasing order.
  std::map<int64_t, int64_t> next_f, next_b, next_w;
  std::vector<int64_t> backward_steps;  // the steps that ran a backward, in order
  size_t weights_done = 0;
  const int64_t one_f_one_b_before_w = rank;  // ZB: backwards before the first weight action
  std::vector<Action> ops;
  auto add_weight = [&] {
    const int64_t stage = backward_stage(backward_steps[weights_done++]);
    ops.push_back({ActionKind::BackwardWeight, next_w[stage]++, stage});
  };
  for (int64_t op = 0; op < total; ++op) {
    if (op < warmup + fwd_bwd) {
      const int64_t stage = forward_stage(op);
      ops.push_back({ActionKind::Forward, next_f[stage]++, stage});
    }
    if (op >= warmup) {
      const int64_t stage = backward_stage(op);
      ops.push_back({backward, next_b[stage]++, stage});
      backward_steps.push_back(op);
      if (zero_bubble && op - warmup >= one_f_one_b_before_w) add_weight();
    }
  }
  while (zero_bubble && weights_done < backward_steps.size()) add_weight();
  return ops;
}

void check_numbers(ScheduleKind kind, int64_t pp, int64_t v, int64_t m) {
  const char* name = schedule_kind_name(kind);
  MT_CHECK(pp >= 1, "pipeline schedule ", name, ": pp must be >= 1, got ", pp);
  MT_CHECK(m >= 1, "pipeline schedule ", name, ": microbatches must be >= 1, got ", m);
  if (!is_interleaved(kind)) {
    MT_CHECK(v == 1, "pipeline schedule ", name,
             " runs one stage per rank (torch's single-stage schedule), got stages_per_rank ", v,
             "; use Interleaved1F1B or InterleavedZeroBubble for several");
  } else {
    MT_CHECK(v >= 2, "pipeline schedule ", name,
             " needs stages_per_rank >= 2 (torchtitan's rule for multi-stage schedules), got ", v);
  }
  if (kind == ScheduleKind::OneFOneB) {
    MT_CHECK(m >= pp,
             "pipeline schedule 1F1B needs microbatches >= pp (torch's Schedule1F1B), "
             "got microbatches ",
             m, " with pp ", pp);
  }
  if (is_interleaved(kind)) {
    const int64_t rounds = std::max<int64_t>(1, m / pp);
    MT_CHECK(m % rounds == 0, "pipeline schedule ", name, " runs micro-batches in rounds = max(1, ",
             "microbatches / pp) = ", rounds, " (torch's rule) and needs microbatches to be a ",
             "multiple of it, got microbatches ", m, " with pp ", pp,
             "; use a multiple of pp or fewer than ", 2 * pp);
  }
}

// ---------------------------------------------------------------------------------------------
// The execution model shared by validate_schedule and simulate_schedule.

// Per (stage, micro-batch): when its Forward, its Backward/BackwardInput and its BackwardInput
// ended (negative: not yet).
struct Progress {
  int64_t m = 0;
  std::vector<double> forward, backward, input;
  Progress(int64_t stages, int64_t microbatches)
      : m(microbatches),
        forward(size_t(stages * microbatches), -1),
        backward(forward),
        input(forward) {}
  size_t at(int64_t s, int64_t mb) const { return size_t(s * m + mb); }
};

// The action `a` needs, and whether it has run. Returns false with `waits_for` set when not.
bool ready(const Action& a, const Progress& p, int64_t last_stage, double& after,
           Action& waits_for) {
  auto need = [&](double done, Action producer) {
    if (done < 0) {
      waits_for = producer;
      return false;
    }
    after = std::max(after, done);
    return true;
  };
  after = 0;
  switch (a.kind) {
    case ActionKind::Forward:
      return a.stage == 0 || need(p.forward[p.at(a.stage - 1, a.microbatch)],
                                  {ActionKind::Forward, a.microbatch, a.stage - 1});
    case ActionKind::Backward:
    case ActionKind::BackwardInput:
      if (!need(p.forward[p.at(a.stage, a.microbatch)],
                {ActionKind::Forward, a.microbatch, a.stage}))
        return false;
      // The gradient comes from the next stage's Backward or BackwardInput; name the first.
      return a.stage == last_stage || need(p.backward[p.at(a.stage + 1, a.microbatch)],
                                           {ActionKind::Backward, a.microbatch, a.stage + 1});
    case ActionKind::BackwardWeight:
      return need(p.input[p.at(a.stage, a.microbatch)],
                  {ActionKind::BackwardInput, a.microbatch, a.stage});
  }
  return false;
}

// Runs every rank's actions in order under the communication model with the given costs,
// returning each action's start time; throws naming the stuck actions when no rank can progress.
std::vector<std::vector<double>> run(const PipelineSchedule& s, const std::array<double, 4>& cost,
                                     std::vector<double>* rank_end) {
  Progress p(s.num_stages(), s.microbatches);
  std::vector<std::vector<double>> start(s.ranks.size());
  std::vector<double> clock(s.ranks.size(), 0.0);
  std::vector<size_t> pos(s.ranks.size(), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < s.ranks.size(); ++r) {
      for (; pos[r] < s.ranks[r].size(); ++pos[r], progress = true) {
        const Action& a = s.ranks[r][pos[r]];
        double after = 0;
        Action waits_for;
        if (!ready(a, p, s.num_stages() - 1, after, waits_for)) break;
        const double t0 = std::max(clock[r], after);
        clock[r] = t0 + cost[size_t(a.kind)];
        start[r].push_back(t0);
        const size_t i = p.at(a.stage, a.microbatch);
        if (a.kind == ActionKind::Forward) p.forward[i] = clock[r];
        if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput)
          p.backward[i] = clock[r];
        if (a.kind == ActionKind::BackwardInput) p.input[i] = clock[r];
      }
    }
  }
  std::ostringstream stuck;
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    if (pos[r] == s.ranks[r].size()) continue;
    const Action& a = s.ranks[r][pos[r]];
    double after = 0;
    Action w;
    ready(a, p, s.num_stages() - 1, after, w);
    const int64_t producer_rank = stage_rank(w.stage, s.pp);
    stuck << "\n  rank " << r << " is stuck at action " << pos[r] << ", " << to_string(a)
          << ": it waits for " << to_string(w);
    if (size_t(producer_rank) == r) {
      stuck << ", which this rank runs only later";
    } else {
      stuck << " on rank " << producer_rank;
    }
  }
  MT_CHECK(stuck.str().empty(), "pipeline schedule ", describe(s),
           " deadlocks (sends never block, a receive waits for its producer, each rank runs its "
           "actions in order):",
           stuck.str());
  if (rank_end) *rank_end = clock;
  return start;
}

// Complete and well placed: one Forward and one Backward (or BackwardInput + BackwardWeight) per
// (stage, micro-batch), each on its stage's rank, indices in range.
void check_complete(const PipelineSchedule& s) {
  MT_CHECK(s.pp >= 1 && s.stages_per_rank >= 1 && s.microbatches >= 1, "pipeline schedule ",
           describe(s), ": pp, stages_per_rank and microbatches must be >= 1");
  MT_CHECK(int64_t(s.ranks.size()) == s.pp, "pipeline schedule ", describe(s), " lists ",
           s.ranks.size(), " ranks' actions, expected pp = ", s.pp);
  const int64_t stages = s.num_stages(), m = s.microbatches;
  std::vector<std::array<int, 4>> count(size_t(stages * m), {0, 0, 0, 0});
  std::vector<std::string> problems;
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (a.stage < 0 || a.stage >= stages || a.microbatch < 0 || a.microbatch >= m) {
        problems.push_back(detail::concat("rank ", r, " action ", i, ", ", to_string(a),
                                          ", is outside stages 0..", stages - 1,
                                          " / micro-batches 0..", m - 1));
        continue;
      }
      if (stage_rank(a.stage, s.pp) != int64_t(r)) {
        problems.push_back(detail::concat("rank ", r, " action ", i, ", ", to_string(a),
                                          ", belongs on rank ", stage_rank(a.stage, s.pp),
                                          " (stage % pp)"));
      }
      ++count[size_t(a.stage * m + a.microbatch)][size_t(a.kind)];
    }
  }
  auto name = [](ActionKind k, int64_t stage, int64_t mb) { return to_string({k, mb, stage}); };
  for (int64_t st = 0; st < stages; ++st) {
    for (int64_t mb = 0; mb < m; ++mb) {
      const auto& c = count[size_t(st * m + mb)];
      const int f = c[0], b = c[1], bi = c[2], bw = c[3];
      for (ActionKind k : {ActionKind::Forward, ActionKind::Backward, ActionKind::BackwardInput,
                           ActionKind::BackwardWeight}) {
        if (c[size_t(k)] > 1)
          problems.push_back(detail::concat(name(k, st, mb), " appears ", c[size_t(k)], " times"));
      }
      if (f == 0)
        problems.push_back(detail::concat(name(ActionKind::Forward, st, mb), " is missing"));
      if (b == 0 && bi == 0 && bw == 0) {
        problems.push_back(detail::concat("stage ", st, " mb ", mb,
                                          " has no backward (one Backward, or one BackwardInput "
                                          "and one BackwardWeight)"));
      } else if (b > 0 && bi + bw > 0) {
        problems.push_back(
            detail::concat("stage ", st, " mb ", mb, " has both a Backward and a split backward"));
      } else if (b == 0 && (bi == 0 || bw == 0)) {
        problems.push_back(detail::concat(
            name(bi == 0 ? ActionKind::BackwardInput : ActionKind::BackwardWeight, st, mb),
            " is missing (its ", bi == 0 ? "BackwardWeight" : "BackwardInput", " is there)"));
      }
    }
  }
  if (problems.empty()) return;
  std::ostringstream os;
  const size_t shown = std::min<size_t>(problems.size(), 8);
  for (size_t i = 0; i < shown; ++i) os << "\n  " << problems[i];
  if (problems.size() > shown) os << "\n  (and " << problems.size() - shown << " more)";
  MT_FAIL("pipeline schedule ", describe(s), " is not complete:", os.str());
}

}  // namespace

ScheduleKind parse_schedule_kind(const std::string& name) {
  for (ScheduleKind k : kAllKinds) {
    if (lower(name) == lower(schedule_kind_name(k))) return k;
  }
  for (const char* other : {"LoopedBFS", "ZBVZeroBubble", "DualPipeV", "PipelineScheduleSingle",
                            "PipelineScheduleMulti"}) {
    MT_CHECK(lower(name) != lower(other), "pipeline schedule '", name,
             "' is one of torch's that minititan does not implement; the valid ones are GPipe, "
             "1F1B, Interleaved1F1B, InterleavedZeroBubble");
  }
  MT_FAIL("unknown pipeline schedule '", name,
          "'; the valid ones are GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble");
}

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return "GPipe";
    case ScheduleKind::OneFOneB:
      return "1F1B";
    case ScheduleKind::Interleaved1F1B:
      return "Interleaved1F1B";
    case ScheduleKind::InterleavedZeroBubble:
      return "InterleavedZeroBubble";
  }
  return "?";
}

bool is_interleaved(ScheduleKind kind) {
  return kind == ScheduleKind::Interleaved1F1B || kind == ScheduleKind::InterleavedZeroBubble;
}

const char* action_kind_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward:
      return "Forward";
    case ActionKind::Backward:
      return "Backward";
    case ActionKind::BackwardInput:
      return "BackwardInput";
    case ActionKind::BackwardWeight:
      return "BackwardWeight";
  }
  return "?";
}

std::string to_string(const Action& action) {
  return detail::concat(action_kind_name(action.kind), "(stage ", action.stage, ", mb ",
                        action.microbatch, ")");
}

int64_t stage_rank(int64_t stage, int64_t pp) {
  MT_CHECK(pp >= 1 && stage >= 0, "stage_rank: needs stage >= 0 and pp >= 1, got stage ", stage,
           " and pp ", pp);
  return stage % pp;
}

PipelineSchedule make_schedule(ScheduleKind kind, int64_t pp, int64_t stages_per_rank,
                               int64_t microbatches) {
  check_numbers(kind, pp, stages_per_rank, microbatches);
  PipelineSchedule s;
  s.kind = kind;
  s.pp = pp;
  s.stages_per_rank = stages_per_rank;
  s.microbatches = microbatches;
  for (int64_t r = 0; r < pp; ++r) {
    switch (kind) {
      case ScheduleKind::GPipe:
        s.ranks.push_back(gpipe_rank(r, microbatches));
        break;
      case ScheduleKind::OneFOneB:
        s.ranks.push_back(one_f_one_b_rank(r, pp, microbatches));
        break;
      case ScheduleKind::Interleaved1F1B:
      case ScheduleKind::InterleavedZeroBubble:
        s.ranks.push_back(interleaved_rank(r, pp, stages_per_rank, microbatches,
                                           kind == ScheduleKind::InterleavedZeroBubble));
        break;
    }
  }
  validate_schedule(s);
  return s;
}

void validate_schedule(const PipelineSchedule& schedule) {
  check_complete(schedule);
  run(schedule, {1, 1, 1, 1}, nullptr);
}

ScheduleTiming simulate_schedule(const PipelineSchedule& schedule, double f, double b, double bi,
                                 double bw) {
  check_complete(schedule);
  ScheduleTiming t;
  std::vector<double> end;
  t.start = run(schedule, {f, b, bi, bw}, &end);
  for (double e : end) t.makespan = std::max(t.makespan, e);
  const std::array<double, 4> cost = {f, b, bi, bw};
  for (const auto& actions : schedule.ranks) {
    double busy = 0;
    for (const Action& a : actions) busy += cost[size_t(a.kind)];
    t.busy.push_back(busy);
    t.bubble_fraction.push_back(t.makespan > 0 ? (t.makespan - busy) / t.makespan : 0.0);
  }
  return t;
}

std::vector<std::vector<double>> unit_start_times(const PipelineSchedule& schedule) {
  return run(schedule, {1, 1, 1, 1}, nullptr);
}

double theoretical_bubble_fraction(ScheduleKind kind, int64_t pp, int64_t stages_per_rank,
                                   int64_t microbatches) {
  const double p = double(pp), v = double(stages_per_rank), m = double(microbatches);
  switch (kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
      return (p - 1) / (m + p - 1);
    case ScheduleKind::Interleaved1F1B:
      return (p - 1) / (v * m + p - 1);
    case ScheduleKind::InterleavedZeroBubble:
      return (p - 1) / (3 * v * m + p - 1);
  }
  return 0;
}

}  // namespace mt::parallel::pipeline
