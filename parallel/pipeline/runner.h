// PipelineRunner: runs one rank's share of a pipeline schedule (parallel/pipeline/schedule.h) for
// one optimizer step's micro-batches: each Forward runs a stage's module on the micro-batch's
// input (the tokens on stage 0, else the activation the previous stage sent) and sends its output
// on; each Backward starts from the loss (last stage) or the gradient the next stage sent, and
// sends the gradient of the stage's input back.
//
// Conventions
// - Activations and their gradients move on the pp group in message rounds
//   (parallel/pipeline/message_rounds.h): each round is one ProcessGroup::batch_isend_irecv
//   (MPI: posted requests; NCCL: one group, so neighbours' crossing messages pair up), posted
//   right after the action producing its sends and before the actions consuming its receives,
//   usually one action or more ahead of them, so they overlap compute. Shapes are known up front
//   (hidden_shape per micro-batch, the stages' compute dtype): nothing is exchanged but the
//   tensors. MPI matches messages by tag (micro-batch, stage, direction); NCCL by their order,
//   which the rounds make the same on both ends.
// - Stages on the same rank (pp = 1 with several virtual stages) hand tensors over in memory.
// - A stage's received input is a leaf that requires grad; its gradient is what the Backward
//   (or BackwardInput) sends back. Zero-bubble schedules split each backward: BackwardInput runs
//   autograd::backward_input (the input's gradient only) and BackwardWeight the rest
//   (autograd::backward_weight), which holds the micro-batch's saved tensors until then. FSDP's
//   hooks pair the halves by backward pass (autograd::current_backward_pass): each weight pass
//   ends with its own reduce-scatters, and a module's gathered parameters stay until its last
//   pending weight pass. Parameters accumulate their gradients over the micro-batches, as
//   autograd does (FSDP's hooks reduce them as for gradient accumulation).
// - The losses: `loss(output, microbatch)` on the last stage gives the micro-batch's loss as the
//   caller wants it differentiated (the trainer's sum / global token count); step() returns their
//   sum, detached (zero on ranks without the last stage). A stage's auxiliary loss goes through
//   `aux_loss` and is a second root of that stage's backward (not part of step()'s sum: the
//   caller's aux_loss records what it wants logged). Evaluation ignores auxiliary losses.
// - Per step, host times per action are kept (last_step_timing) for the bubble measurement:
//   busy = time in the actions' compute, the rest of the step is idle (waiting for a neighbour).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/pipeline/message_rounds.h"
#include "parallel/pipeline/schedule.h"
#include "runtime/nn/module.h"

namespace mt::parallel::pipeline {

// A stage this rank holds: its global index and its module (built for that stage alone).
struct LocalStage {
  int64_t index = 0;
  std::shared_ptr<runtime::nn::Module> module;
};

// A stage's forward result: its output, and an auxiliary loss of its own layers (e.g. MoE load
// balancing; undefined when none).
struct StageOutput {
  Tensor output;
  Tensor aux_loss;
};

struct StageFunctions {
  // The stage's forward: the previous stage's output (the tokens on stage 0) -> its output.
  std::function<StageOutput(runtime::nn::Module& stage, const Tensor& input)> forward;
  // Last stage: the loss of micro-batch `microbatch` from its output (0-D, differentiable).
  std::function<Tensor(const Tensor& output, int64_t microbatch)> loss;
  // A stage's auxiliary loss of micro-batch `microbatch` -> the term its backward adds to the
  // loss (0-D, differentiable): the stage backpropagates it with the gradient from the next
  // stage, so its input's gradient carries it upstream. Needed when a stage returns one.
  std::function<Tensor(const Tensor& aux_loss, int64_t microbatch)> aux_loss;
};

// Host seconds of the last step on this rank: its wall time and the time in actions (compute
// and the backward's own work; waits for neighbours' tensors excluded).
struct PipelineStepTiming {
  double step_seconds = 0;
  double busy_seconds = 0;
  double bubble_fraction() const {
    return step_seconds > 0 ? 1.0 - busy_seconds / step_seconds : 0.0;
  }
};

class PipelineRunner {
 public:
  // `schedule` for every rank (this rank runs schedule.ranks[pp_group->rank()]); `stages`: this
  // rank's stages, those stage_rank places here. hidden_shape: the shape passed between stages
  // for one micro-batch ([mb, seq, dim]); hidden_options: its dtype and device.
  PipelineRunner(PipelineSchedule schedule, std::shared_ptr<ProcessGroup> pp_group,
                 std::vector<LocalStage> stages, StageFunctions functions,
                 std::vector<int64_t> hidden_shape, runtime::TensorOptions hidden_options);
  ~PipelineRunner();
  PipelineRunner(const PipelineRunner&) = delete;
  PipelineRunner& operator=(const PipelineRunner&) = delete;

  // One step: inputs[m] is micro-batch m's input to stage 0 (read only where stage 0 runs;
  // schedule.microbatches of them). Returns the sum of the micro-batches' losses (0-D, detached)
  // where the last stage runs, else an undefined tensor.
  Tensor step(const std::vector<Tensor>& inputs);
  // Evaluation: the schedule's Forward actions alone, in its order, without autograd, and
  // `loss(output, microbatch)` on the last stage instead of functions.loss. Returns the sum of
  // those losses where the last stage runs, else an undefined tensor.
  Tensor forward_only(const std::vector<Tensor>& inputs,
                      const std::function<Tensor(const Tensor& output, int64_t microbatch)>& loss);

  // Inference on one input outside the schedule (decoding: a prompt, then one token at a time):
  // the stages run in order, stage 0 on `input`, each on its predecessor's output (the stages
  // between exchange tensors of shape `hidden_shape` in the hidden dtype: the caller's shape for
  // this input, e.g. [1, T, dim]), each through `forward(stage index, module, input)` (the
  // caller's per-stage state, such as KV caches, keyed by the index), without autograd. Every
  // rank of the pp group calls it with the same shape. Returns the last stage's output where it
  // runs, else an undefined tensor.
  Tensor forward_through_stages(
      const Tensor& input, const std::vector<int64_t>& hidden_shape,
      const std::function<Tensor(int64_t stage, runtime::nn::Module& module, const Tensor& input)>&
          forward);

  const PipelineSchedule& schedule() const { return schedule_; }
  const std::vector<LocalStage>& stages() const { return stages_; }
  bool holds_stage(int64_t stage) const;
  bool holds_last_stage() const { return holds_stage(schedule_.num_stages() - 1); }
  const PipelineStepTiming& last_step_timing() const { return timing_; }

 private:
  struct Inflight;  // one step's tensors in flight (runner.cpp)

  runtime::nn::Module& module_of(int64_t stage) const;
  int tag(int64_t stage, int64_t microbatch, bool gradient) const;
  // Posts `round`'s sends (tensors its actions computed) and receives as one batch.
  void post_round(const MessageRound& round, Inflight& state);
  void run_forward(const Action& action, const std::vector<Tensor>& inputs, Inflight& state);
  // Runs `actions` (this rank's, or their Forward ones) with their rounds, then waits for the
  // sends.
  void run_actions(const std::vector<Action>& actions, const std::vector<MessageRound>& rounds,
                   const std::vector<Tensor>& inputs, Inflight& state);
  // Backward, or BackwardInput (the zero-bubble split: runtime/autograd/engine.h).
  void run_backward(const Action& action, Inflight& state);
  void run_backward_weight(const Action& action, Inflight& state);

  PipelineSchedule schedule_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<LocalStage> stages_;
  StageFunctions functions_;
  std::vector<int64_t> hidden_shape_;
  runtime::TensorOptions hidden_options_;
  std::vector<MessageRound> rounds_;          // this rank's, for step()
  std::vector<Action> forward_actions_;       // this rank's Forward actions, for forward_only()
  std::vector<MessageRound> forward_rounds_;  // their rounds
  PipelineStepTiming timing_;
};

}  // namespace mt::parallel::pipeline
