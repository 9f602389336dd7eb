#include "parallel/pipeline/runner.h"

#include <chrono>
#include <limits>
#include <string>

#include "runtime/autograd/engine.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"

namespace mt::parallel::pipeline {

namespace {

using Clock = std::chrono::steady_clock;
using Key = std::pair<int64_t, int64_t>;  // (stage, micro-batch)

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A tensor on its way in: posted (work pending) or already here.
struct Incoming {
  Tensor buf;
  Work work;
  bool posted = false;
};

}  // namespace

struct PipelineRunner::Inflight {
  std::map<Key, Incoming> inputs;        // a stage's input for a micro-batch
  std::map<Key, Incoming> output_grads;  // the gradient of a stage's output
  std::map<Key, Tensor> stage_inputs;    // the input leaf each forward ran on (backward reads its grad)
  std::map<Key, Tensor> outputs;         // a forward's output (the loss on the last stage)
  std::map<Key, Tensor> aux_terms;       // a forward's auxiliary loss term (not on the last stage)
  std::map<Key, runtime::autograd::DeferredBackward> weight_work;  // BackwardInput's rest
  std::map<StageMessage, Tensor> outgoing;  // produced, to be sent in its round
  std::vector<Work> sends;
  Tensor loss_sum;
  // Evaluation (forward_only): no autograd, nothing kept for a backward, this loss.
  const std::function<Tensor(const Tensor&, int64_t)>* eval_loss = nullptr;
};

PipelineRunner::PipelineRunner(PipelineSchedule schedule, std::shared_ptr<ProcessGroup> pp_group,
                               std::vector<LocalStage> stages, StageFunctions functions,
                               std::vector<int64_t> hidden_shape,
                               runtime::TensorOptions hidden_options)
    : schedule_(std::move(schedule)),
      group_(std::move(pp_group)),
      stages_(std::move(stages)),
      functions_(std::move(functions)),
      hidden_shape_(std::move(hidden_shape)),
      hidden_options_(hidden_options.with_requires_grad(false)) {
  MT_CHECK(group_ != nullptr, "PipelineRunner: no pp process group");
  MT_CHECK(group_->size() == schedule_.pp, "PipelineRunner: the pp group has ", group_->size(),
           " ranks but the schedule is for pp = ", schedule_.pp);
  MT_CHECK(functions_.forward && functions_.loss, "PipelineRunner: forward and loss are needed");
  const int64_t rank = group_->rank();
  for (int64_t s = 0; s < schedule_.num_stages(); ++s) {
    MT_CHECK(holds_stage(s) == (stage_rank(s, schedule_.pp) == rank), "PipelineRunner: rank ",
             rank, (holds_stage(s) ? " holds" : " lacks"), " stage ", s, " of ",
             schedule_.num_stages(), ", which the schedule places on rank ",
             stage_rank(s, schedule_.pp));
  }
  const int64_t tags = schedule_.microbatches * schedule_.num_stages() * 2;
  MT_CHECK(tags <= std::numeric_limits<int>::max(), "PipelineRunner: ", schedule_.microbatches,
           " micro-batches x ", schedule_.num_stages(), " stages need more message tags than ",
           "an int holds");
  rounds_ = message_rounds(schedule_).at(size_t(rank));
  // Evaluation runs every rank's forwards in their order: they wait only on forwards, which ran
  // before them in the whole schedule too, so the projection is deadlock-free as the schedule is.
  PipelineSchedule forwards = schedule_;
  for (auto& actions : forwards.ranks) {
    std::erase_if(actions, [](const Action& a) { return a.kind != ActionKind::Forward; });
  }
  forward_rounds_ = message_rounds(forwards).at(size_t(rank));
  forward_actions_ = std::move(forwards.ranks.at(size_t(rank)));
}

PipelineRunner::~PipelineRunner() = default;

bool PipelineRunner::holds_stage(int64_t stage) const {
  for (const LocalStage& s : stages_)
    if (s.index == stage) return true;
  return false;
}

runtime::nn::Module& PipelineRunner::module_of(int64_t stage) const {
  for (const LocalStage& s : stages_)
    if (s.index == stage) return *s.module;
  MT_FAIL("PipelineRunner: rank ", group_->rank(), " holds no stage ", stage);
}

int PipelineRunner::tag(int64_t stage, int64_t microbatch, bool gradient) const {
  return int((microbatch * schedule_.num_stages() + stage) * 2 + (gradient ? 1 : 0));
}

void PipelineRunner::post_round(const MessageRound& round, Inflight& state) {
  const int rank = group_->rank();
  std::vector<ProcessGroup::P2POp> ops;
  std::vector<Incoming*> receives;  // per op: the slot a receive fills (nullptr for a send)
  for (const StageMessage& m : round.messages) {
    const int64_t to = m.to_stage();
    const int t = tag(to, m.microbatch, m.gradient);
    if (stage_rank(m.from_stage, schedule_.pp) == rank) {
      auto it = state.outgoing.find(m);
      MT_CHECK(it != state.outgoing.end(), "PipelineRunner: the round at time ", round.time,
               " sends stage ", m.from_stage, "'s ", m.gradient ? "input gradient" : "output",
               " of micro-batch ", m.microbatch, " before it was computed");
      ops.push_back({ProcessGroup::P2POp::Kind::Send, it->second,
                     int(stage_rank(to, schedule_.pp)), t,
                     m.gradient ? "pipeline.send_gradient" : "pipeline.send_activation"});
      state.outgoing.erase(it);
      receives.push_back(nullptr);
    } else {
      Incoming& slot = m.gradient ? state.output_grads[{to, m.microbatch}]
                                  : state.inputs[{to, m.microbatch}];
      slot.buf = Tensor::empty(hidden_shape_, hidden_options_);
      slot.posted = true;
      ops.push_back({ProcessGroup::P2POp::Kind::Recv, slot.buf,
                     int(stage_rank(m.from_stage, schedule_.pp)), t,
                     m.gradient ? "pipeline.recv_gradient" : "pipeline.recv_activation"});
      receives.push_back(&slot);
    }
  }
  std::vector<Work> works = group_->batch_isend_irecv(ops);
  for (size_t i = 0; i < works.size(); ++i) {
    if (receives[i] != nullptr) {
      receives[i]->work = std::move(works[i]);
    } else {
      state.sends.push_back(std::move(works[i]));
    }
  }
}

namespace {

// The tensor of `key` in `map`, once here (waiting for a posted receive); erased from the map.
Tensor take(std::map<Key, Incoming>& map, const Key& key, const char* what) {
  auto it = map.find(key);
  MT_CHECK(it != map.end() && it->second.buf.defined(), "PipelineRunner: no ", what,
           " for stage ", key.first, ", micro-batch ", key.second,
           " (the schedule runs an action before the one producing its input)");
  if (it->second.posted) it->second.work.wait();
  Tensor t = it->second.buf;
  map.erase(it);
  return t;
}

}  // namespace

void PipelineRunner::run_forward(const Action& action, const std::vector<Tensor>& inputs,
                                 Inflight& state) {
  const int64_t s = action.stage, m = action.microbatch;
  const int64_t last = schedule_.num_stages() - 1;
  Tensor x;
  if (s == 0) {
    MT_CHECK(m < int64_t(inputs.size()) && inputs[size_t(m)].defined(), "PipelineRunner: ",
             inputs.size(), " inputs for ", schedule_.microbatches, " micro-batches");
    x = inputs[size_t(m)];
  } else {
    x = take(state.inputs, {s, m}, "input activation");
    if (!state.eval_loss) x.set_requires_grad(true);
  }
  const auto t0 = Clock::now();
  StageOutput out = functions_.forward(module_of(s), x);
  Tensor y = out.output;
  Tensor aux;  // the auxiliary loss term this stage backpropagates (training only)
  if (out.aux_loss.defined() && !state.eval_loss) {
    MT_CHECK(functions_.aux_loss != nullptr, "PipelineRunner: stage ", s,
             " returned an auxiliary loss but StageFunctions::aux_loss is not set");
    aux = functions_.aux_loss(out.aux_loss, m);
  }
  if (!state.eval_loss) state.stage_inputs[{s, m}] = x;
  if (s == last) {
    Tensor loss = state.eval_loss ? (*state.eval_loss)(y, m) : functions_.loss(y, m);
    state.loss_sum = state.loss_sum.defined() ? runtime::add(state.loss_sum, loss.detach())
                                              : loss.detach();
    if (aux.defined()) loss = runtime::add(loss, aux.to(loss.dtype()));
    if (!state.eval_loss) state.outputs[{s, m}] = loss;
  } else {
    if (!state.eval_loss) state.outputs[{s, m}] = y;
    if (aux.defined()) state.aux_terms[{s, m}] = aux;
    Tensor sent = y.detach().contiguous();
    if (stage_rank(s + 1, schedule_.pp) == group_->rank()) {
      state.inputs[{s + 1, m}].buf = sent;
    } else {
      state.outgoing[StageMessage{s, m, false}] = sent;
    }
  }
  timing_.busy_seconds += seconds_since(t0);
}

void PipelineRunner::run_backward(const Action& action, Inflight& state) {
  const int64_t s = action.stage, m = action.microbatch;
  const int64_t last = schedule_.num_stages() - 1;
  auto out = state.outputs.find({s, m});
  MT_CHECK(out != state.outputs.end(), "PipelineRunner: ", to_string(action),
           " before its forward");
  std::vector<Tensor> roots{out->second}, grad;  // no gradient given for the loss
  if (s != last) grad.push_back(take(state.output_grads, {s, m}, "output gradient"));
  if (auto aux = state.aux_terms.find({s, m}); aux != state.aux_terms.end()) {
    roots.push_back(aux->second);  // a 0-D root: its gradient is one (undefined)
    grad.push_back(Tensor());
    state.aux_terms.erase(aux);
  }
  const auto t0 = Clock::now();
  Tensor input = state.stage_inputs.at({s, m});
  if (action.kind == ActionKind::Backward) {
    runtime::autograd::backward(roots, grad);
  } else {
    // Zero bubble: the input's gradient now, the weights' at this (stage, micro-batch)'s
    // BackwardWeight. Stage 0's input (tokens) has none: all of it is weight work.
    std::vector<Tensor> inputs;
    if (s > 0) inputs.push_back(input);
    state.weight_work[{s, m}] = runtime::autograd::backward_input(roots, grad, inputs);
  }
  state.outputs.erase(out);
  state.stage_inputs.erase({s, m});
  if (s > 0) {
    Tensor gx = input.grad();
    MT_CHECK(gx.defined(), "PipelineRunner: stage ", s, "'s output does not depend on its input");
    gx = gx.contiguous();
    if (stage_rank(s - 1, schedule_.pp) == group_->rank()) {
      state.output_grads[{s - 1, m}].buf = gx;
    } else {
      state.outgoing[StageMessage{s, m, true}] = gx;
    }
  }
  timing_.busy_seconds += seconds_since(t0);
}

void PipelineRunner::run_backward_weight(const Action& action, Inflight& state) {
  auto it = state.weight_work.find({action.stage, action.microbatch});
  MT_CHECK(it != state.weight_work.end(), "PipelineRunner: ", to_string(action),
           " before its BackwardInput");
  const auto t0 = Clock::now();
  runtime::autograd::backward_weight(std::move(it->second));
  state.weight_work.erase(it);
  timing_.busy_seconds += seconds_since(t0);
}

Tensor PipelineRunner::step(const std::vector<Tensor>& inputs) {
  const auto t0 = Clock::now();
  timing_ = {};
  Inflight state;
  run_actions(schedule_.ranks.at(size_t(group_->rank())), rounds_, inputs, state);
  MT_CHECK(state.outputs.empty() && state.stage_inputs.empty() && state.weight_work.empty(),
           "PipelineRunner: ", state.outputs.size(), " forwards of rank ", group_->rank(),
           " had no backward, ", state.weight_work.size(), " no BackwardWeight");
  timing_.step_seconds = seconds_since(t0);
  return state.loss_sum;
}

Tensor PipelineRunner::forward_only(
    const std::vector<Tensor>& inputs,
    const std::function<Tensor(const Tensor& output, int64_t microbatch)>& loss) {
  runtime::NoGradGuard no_grad;
  Inflight state;
  state.eval_loss = &loss;
  run_actions(forward_actions_, forward_rounds_, inputs, state);
  return state.loss_sum;
}

Tensor PipelineRunner::forward_through_stages(
    const Tensor& input, const std::vector<int64_t>& hidden_shape,
    const std::function<Tensor(int64_t, runtime::nn::Module&, const Tensor&)>& forward) {
  runtime::NoGradGuard no_grad;
  const int64_t last = schedule_.num_stages() - 1;
  const int rank = group_->rank();
  std::vector<Work> sends;
  Tensor x;  // the output of the stage before, when this rank ran it
  Tensor result;
  for (int64_t s = 0; s <= last; ++s) {
    if (!holds_stage(s)) {
      x = Tensor();
      continue;
    }
    if (s == 0) {
      x = input;
    } else if (!x.defined()) {  // the previous stage ran on another rank
      x = Tensor::empty(hidden_shape, hidden_options_);
      group_->irecv(x, int(stage_rank(s - 1, schedule_.pp)), tag(s, 0, false),
                    "pipeline.recv_activation")
          .wait();
    }
    x = forward(s, module_of(s), x);
    MT_CHECK(s == last || x.shape() == hidden_shape, "PipelineRunner: stage ", s, " returned ",
             x.shape(), " where its successor expects ", hidden_shape);
    if (s == last) {
      result = x;
      break;
    }
    const int64_t peer = stage_rank(s + 1, schedule_.pp);
    if (peer != rank) {
      x = x.to(hidden_options_.dtype).contiguous();
      sends.push_back(group_->isend(x, int(peer), tag(s + 1, 0, false), "pipeline.send_activation"));
      x = Tensor();
    }
  }
  for (const Work& w : sends) w.wait();
  return result;
}

void PipelineRunner::run_actions(const std::vector<Action>& actions,
                                 const std::vector<MessageRound>& rounds,
                                 const std::vector<Tensor>& inputs, Inflight& state) {
  size_t next_round = 0;
  auto post_rounds_before = [&](size_t action) {
    for (; next_round < rounds.size() && rounds[next_round].before_action <= action; ++next_round)
      post_round(rounds[next_round], state);
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    post_rounds_before(i);
    const Action& a = actions[i];
    switch (a.kind) {
      case ActionKind::Forward: run_forward(a, inputs, state); break;
      case ActionKind::Backward:
      case ActionKind::BackwardInput: run_backward(a, state); break;
      case ActionKind::BackwardWeight: run_backward_weight(a, state); break;
    }
  }
  post_rounds_before(actions.size());
  MT_CHECK(state.outgoing.empty(), "PipelineRunner: ", state.outgoing.size(),
           " computed tensors of rank ", group_->rank(), " were never sent");
  for (const Work& w : state.sends) w.wait();
}

}  // namespace mt::parallel::pipeline
