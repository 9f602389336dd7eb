// Pipeline schedules as data: for each pp rank, the ordered list of compute actions (forward,
// backward, or backward split into input and weight parts) it runs for one optimizer step's
// micro-batches. No model, no communication: a schedule can be built, checked, timed and printed
// on its own; parallel/pipeline/runner.h executes one.
//
// Conventions
// - Names and orderings follow torch.distributed.pipelining (what torchtitan runs): "GPipe",
//   "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"; each rank's action order is the one
//   torch's schedule class computes (its idle slots dropped), so runs compare with torchtitan.
// - Stages are global indices 0..pp*v-1 (v = stages_per_rank), placed "loop" style: stage s runs
//   on rank s % pp, so rank r holds stages r, r+pp, r+2pp, ...
// - Micro-batches are 0..m-1. For every stage, backward (or backward-input, and backward-weight)
//   actions run micro-batches in increasing order in every schedule here, so weight gradients
//   accumulate in the same order whichever schedule runs.
// - Communication model (the runner's): a send never blocks (isend); the action that needs a
//   neighbour's tensor blocks until the neighbour has run the action producing it; a rank runs its
//   actions strictly in list order. validate_schedule proves a schedule complete and deadlock-free
//   under that model; every schedule make_schedule returns has passed it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::parallel::pipeline {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved1F1B, InterleavedZeroBubble };

// torch's names, matched case-insensitively as torch's get_schedule_class does (so a torchtitan
// config's value works as is); an unknown name throws mt::Error listing the valid ones.
ScheduleKind parse_schedule_kind(const std::string& name);
const char* schedule_kind_name(ScheduleKind kind);  // the canonical spelling, e.g. "1F1B"
// Interleaved1F1B and InterleavedZeroBubble: several stages per rank (torch's multi-stage ones).
bool is_interleaved(ScheduleKind kind);

enum class ActionKind {
  Forward,
  Backward,        // input and weight gradients together
  BackwardInput,   // the gradient of the stage's input only (what the previous stage waits for)
  BackwardWeight,  // the weight gradients, after the same (stage, micro-batch)'s BackwardInput
};
const char* action_kind_name(ActionKind kind);  // "Forward", "Backward", ...

struct Action {
  ActionKind kind = ActionKind::Forward;
  int64_t microbatch = 0;
  int64_t stage = 0;  // global stage index
  bool operator==(const Action&) const = default;
};
// "Forward(stage 2, mb 0)": for messages.
std::string to_string(const Action& action);

struct PipelineSchedule {
  ScheduleKind kind = ScheduleKind::GPipe;
  int64_t pp = 1;
  int64_t stages_per_rank = 1;
  int64_t microbatches = 1;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in the order it runs them
  int64_t num_stages() const { return pp * stages_per_rank; }
};

// The rank stage `stage` runs on ("loop" placement): stage % pp.
int64_t stage_rank(int64_t stage, int64_t pp);

// Builds the schedule and validates it. Throws mt::Error naming the numbers when it cannot run:
// - pp < 1 or microbatches < 1;
// - GPipe and 1F1B need stages_per_rank == 1 (torch's single-stage schedules); the interleaved ones
//   need stages_per_rank >= 2 (torchtitan's rule for multi-stage schedules);
// - 1F1B needs microbatches >= pp (torch's Schedule1F1B);
// - the interleaved ones group micro-batches in rounds = max(1, m / pp) of m / rounds each and
//   need m % rounds == 0 (torch's rule; it holds for any m below 2 * pp or a multiple of pp, and
//   fails e.g. for pp 2, m 5).
PipelineSchedule make_schedule(ScheduleKind kind, int64_t pp, int64_t stages_per_rank,
                               int64_t microbatches);

// Checks that a schedule is complete and deadlock-free: every (stage, micro-batch) has exactly one
// Forward and either one Backward or one BackwardInput and one BackwardWeight, each on the rank
// stage_rank names; Forward(s, m) runs after Forward(s-1, m); Backward/BackwardInput(s, m) after
// Forward(s, m) and after Backward/BackwardInput(s+1, m); BackwardWeight(s, m) after
// BackwardInput(s, m). Order and deadlock-freedom are checked by running the ranks under the
// communication model above; when no rank can progress, the mt::Error names each unfinished
// rank's first stuck action and what it waits for.
void validate_schedule(const PipelineSchedule& schedule);

// A timing simulation under the same model, with a cost per action kind (forward f, full backward
// b, backward-input bi, backward-weight bw) and free communication; every rank starts at 0 and
// an action starts when its rank is free and its inputs are produced. Throws as validate_schedule
// when the schedule cannot run.
struct ScheduleTiming {
  double makespan = 0;                     // when the last action ends
  std::vector<double> busy;                // per rank: the sum of its actions' costs
  std::vector<double> bubble_fraction;     // per rank: (makespan - busy) / makespan
  std::vector<std::vector<double>> start;  // start[r][i]: when ranks[r][i] starts
};
ScheduleTiming simulate_schedule(const PipelineSchedule& schedule, double f = 1, double b = 2,
                                 double bi = 1, double bw = 1);

// Each action's start when every action takes one time unit (the model above, free
// communication): start[r][i] for ranks[r][i]. Takes the lists as they are, so it also times a
// projection such as the Forward actions alone; throws as validate_schedule when they cannot run.
std::vector<std::vector<double>> unit_start_times(const PipelineSchedule& schedule);

// The bubble fraction theory predicts for each rank, as simulate_schedule measures it with its
// default costs (f=1, b=2, bi=bw=1), p = pp, v = stages_per_rank, m = microbatches:
// - GPipe, 1F1B: (p - 1) / (m + p - 1);
// - Interleaved1F1B: (p - 1) / (v*m + p - 1) (Megatron's interleaved schedule: the warm-up and
//   cool-down shrink to 1/v);
// - InterleavedZeroBubble: the zero-bubble paper's ZB-H1 bubble, (p - 1)(F + B - W) time units
//   with F = B(input) = W = 1 per chunk, against v*m*(F + B + W) units of work per rank, i.e.
//   (p - 1) / (3*v*m + p - 1): a third of the interleaved bubble's time.
// torch's orderings reach these exactly when m is a multiple of p (the tests check); otherwise
// they are estimates.
double theoretical_bubble_fraction(ScheduleKind kind, int64_t pp, int64_t stages_per_rank,
                                   int64_t microbatches);

// A text grid like the zero-bubble paper's pictures, from simulate_schedule with f=1, b=2, bi=bw=1:
// a header line (schedule, pp, v, micro-batches, makespan, simulated bubble fraction per rank),
// then one row per rank, one column per time unit. A cell is "F3" (forward of micro-batch 3), "B3"
// (full backward: two columns, both labelled), "I3" (backward-input), "W3" (backward-weight), with
// the stage appended when v > 1 ("F3.s5"), or '.' when idle; cells are padded to one width, rows
// end without trailing spaces, and rows past 132 characters are cut into blocks of time columns,
// each headed "t FIRST..LAST:". E.g. GPipe, pp 2, 2 micro-batches:
//   GPipe pp=2 v=1 microbatches=2 makespan=9 (f=1 b=2 i=1 w=1) bubble: r0=0.333 r1=0.333
//   rank 0 | F0 F1 .  .  .  B0 B0 B1 B1
//   rank 1 | .  F0 F1 B0 B0 B1 B1 .  .
std::string render_schedule(const PipelineSchedule& schedule);

}  // namespace mt::parallel::pipeline
