// Message rounds: a pipeline schedule's point-to-point messages (activations forward, their
// gradients backward) grouped so that a backend which runs each rank's messages in issue order
// on one stream (NCCL) cannot deadlock.
//
// The schedule's model (schedule.h) has sends that never wait, which MPI's posted requests give.
// On NCCL a rank's sends and receives run in issue order on its communication stream and a send
// waits there for its peer's receive: two neighbours that each post a receive before a send to
// the other would wait for each other forever. So the runner posts a step's messages in rounds,
// in the spirit of torch.distributed.pipelining's lockstep: with every action taking one time unit
// (unit_start_times), a message whose producer ends at time t belongs to round t. Each rank posts
// its rounds in increasing t, each as one batch (ProcessGroup::batch_isend_irecv: one NCCL group)
// holding its sends and receives of the round in one canonical order, right before its first
// action that starts at t or later (after its last action when none does). Then:
// - both ends of a message post it in the same round, and a round's batches on two ranks hold the
//   messages between them in the same order: they pair;
// - a send is posted after its producer ran (the producer ends at t, before any action starting at
//   t or later) and a receive before its consumer (which starts at t or later);
// - so round t waits only for compute that waits for rounds before t: by induction over t, every
//   round completes (the actions before a round's position need only rounds posted before it,
//   which are earlier ones).
// message_rounds checks these conditions (check_message_rounds), as make_schedule validates its
// schedules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mt::parallel::pipeline {

// One message of a step: stage `from_stage`'s output for micro-batch `microbatch`, to stage
// from_stage + 1 (an activation, from a Forward), or the gradient of stage from_stage's input, to
// stage from_stage - 1 (from a Backward or BackwardInput).
struct StageMessage {
  int64_t from_stage = 0;
  int64_t microbatch = 0;
  bool gradient = false;
  int64_t to_stage() const { return gradient ? from_stage - 1 : from_stage + 1; }
  auto operator<=>(const StageMessage&) const = default;
};

struct MessageRound {
  int64_t time = 0;          // when the round's producers end (unit time)
  size_t before_action = 0;  // posted right before the rank's action of this index (the number
                             // of its actions: after the last)
  std::vector<StageMessage> messages;  // this rank's sends and receives, in canonical order
};

// rounds[r]: rank r's rounds in increasing time (only those holding a message of rank r); the
// messages between stages on one rank (pp = 1) are handed over in memory and appear in none.
// Works on any lists unit_start_times can time (complete schedules and their Forward-only
// projections) and checks the result with check_message_rounds.
using MessageRounds = std::vector<std::vector<MessageRound>>;
MessageRounds message_rounds(const PipelineSchedule& schedule);

// Throws mt::Error naming the first violation of the conditions above: each rank's rounds in
// increasing time and position; every message crossing ranks posted once by its sender and once
// by its receiver, in rounds of the same time whose messages between the two are in the same
// order; each send posted after the action producing it, each receive before the action
// consuming it.
void check_message_rounds(const PipelineSchedule& schedule, const MessageRounds& rounds);

}  // namespace mt::parallel::pipeline
