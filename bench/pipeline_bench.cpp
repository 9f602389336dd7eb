// Pipeline parallelism per schedule: the bubble each rank measures against theory and the
// schedule simulation, and the activation memory each rank's stages hold. Run under mpirun; the
// world is the pipeline (pp = number of ranks):
//
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpirun -np 2 --oversubscribe
//       build/bench/pipeline_bench [--microbatches 8] [--steps 3] [--warmup 1] [--v 2]
//       [--dim 512] [--layers 8] [--heads 4] [--seq 128] [--mb 1] [--vocab 2000]
//       [--schedules GPipe,1F1B,Interleaved1F1B,InterleavedZeroBubble] [--render]
//       [--verbose]
//
// (bench/pipeline_bench.sh runs pp 2 and pp 4 with the environment set.)
//
// For each schedule it builds this rank's llama stages alone (models::llama::Transformer over a
// LayerRange from stage_layer_ranges: the first stage holds the embeddings, the last the final
// norm and output), f32, and runs a PipelineRunner over the world with stage_forward and the loss
// cross_entropy(sum) / (the step's tokens), on random tokens from a fixed seed. Warm-up steps,
// then --steps timed ones; gradients are zeroed in place between steps (no optimizer), so they
// are held before each step and do not count as activations. Interleaved schedules use --v stages
// per rank, the others one.
//
// Rank 0 prints one Markdown row per schedule (per-rank values as "rank 0 / rank 1 / ..."):
// - step (s): the pipeline's step, from the barrier to the slowest rank's end, mean over the
//   timed steps; busy per rank (s per step).
// - busy is PipelineRunner::last_step_timing's: host wall time inside the rank's actions (the
//   stage forwards and loss, the backwards, posting the sends). The time a rank waits for a
//   neighbour's activation or gradient, and at the end for its sends, is idle. Every step starts
//   after a barrier, so no rank carries the previous step's skew into the next.
// - bubble, runner: its bubble_fraction(), 1 - busy / the rank's own step (summed over the timed
//   steps). A rank that finishes early (the last one, under 1F1B) counts only up to its end.
// - bubble vs pipeline step: 1 - busy / the pipeline's step: simulate_schedule's and the theory's
//   definition (the makespan), so this is the column to hold against them.
// - simulated (f 1, b 2): simulate_schedule with the theory's costs (bi = bw = 1).
// - simulated (measured stage costs): the same model with each stage's own measured costs (f:
//   its mean forward, the loss included on the last stage; b: the rank's busy time outside
//   forwards per backward, shared among its stages by forward time; zero bubble's bi = bw = b / 2,
//   an assumption, as the runner does not time the halves apart, and stage 0's bi = 0: it has no
//   input gradient). Unlike the theory it sees unequal stages (the first holds the embedding, the
//   last the output projection and the loss); what it still misses is communication and the
//   runner's own overhead.
// - theory: theoretical_bubble_fraction (the same for every rank).
// - peak activations per rank (MiB): the CPU allocator's peak during a step minus the bytes in
//   use just before it (parameters, zeroed gradients, inputs), the largest over the timed steps:
//   the saved tensors of the micro-batches in flight, the received and sent activations and
//   gradients, and the backward's temporaries.
// - max in flight per rank, from the schedule: the most (stage, micro-batch) forwards whose
//   backward has not finished (a Forward holds one until its Backward, or its BackwardWeight under
//   zero bubble): what the peak memory should follow.
// - forward wall / CPU per rank: the forwards' wall time over this thread's CPU time in them.
//   About 1 when a rank has a core to itself; above 1 when ranks share cores (more ranks than
//   cores, or other work on the machine): then busy times, and the bubbles made of them, include
//   time-slicing. A check on each row.
// --verbose adds each stage's measured f and b (ms) under the row; --render draws the schedule.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "models/llama/model.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/comm/object_collectives.h"
#include "parallel/pipeline/runner.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_split.h"
#include "runtime/core/allocator.h"
#include "runtime/core/error.h"
#include "runtime/core/rng.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "tools/flags.h"

namespace {

using namespace mt;
using runtime::Tensor;
namespace pipe = parallel::pipeline;
using Clock = std::chrono::steady_clock;

struct Options {
  int64_t microbatches = 8, steps = 3, warmup = 1, v = 2;
  int64_t dim = 512, layers = 8, heads = 4, seq = 128, mb = 1, vocab = 2000;
  std::string schedules = "GPipe,1F1B,Interleaved1F1B,InterleavedZeroBubble";
  bool render = false, verbose = false;
};

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// This thread's CPU seconds (one thread per rank: OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1).
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Per rank: the most (stage, micro-batch) pairs forwarded and not yet fully backwarded.
std::vector<int64_t> max_in_flight(const pipe::PipelineSchedule& schedule) {
  std::vector<int64_t> out;
  for (const auto& actions : schedule.ranks) {
    int64_t now = 0, most = 0;
    for (const pipe::Action& a : actions) {
      // A BackwardInput frees part of what its forward saved; the rest waits for BackwardWeight.
      if (a.kind == pipe::ActionKind::Forward) ++now;
      if (a.kind == pipe::ActionKind::Backward || a.kind == pipe::ActionKind::BackwardWeight)
        --now;
      most = std::max(most, now);
    }
    out.push_back(most);
  }
  return out;
}

// simulate_schedule's model (a rank runs its actions in order, an action starts when its rank is
// free and its input is produced, communication is free) with a cost per stage rather than per
// action kind: f[s], b[s] (a full Backward), bi[s], bw[s]. Returns each rank's bubble against the
// makespan, as simulate_schedule does.
std::vector<double> simulate_per_stage(const pipe::PipelineSchedule& schedule,
                                       const std::vector<double>& f, const std::vector<double>& b,
                                       const std::vector<double>& bi,
                                       const std::vector<double>& bw) {
  const int64_t pp = schedule.pp, n = schedule.num_stages(), m = schedule.microbatches;
  // When each (stage, micro-batch)'s forward and backward (or backward-input) end; -1: not yet.
  std::vector<double> forward_end(size_t(n * m), -1.0), backward_end(size_t(n * m), -1.0);
  auto at = [m](int64_t s, int64_t mb) { return size_t(s * m + mb); };
  std::vector<size_t> next(size_t(pp), 0);
  std::vector<double> free_at(size_t(pp), 0), busy(size_t(pp), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < pp; ++r) {
      const auto& actions = schedule.ranks[size_t(r)];
      for (size_t& i = next[size_t(r)]; i < actions.size(); ++i) {
        const pipe::Action& a = actions[i];
        const int64_t s = a.stage, mb = a.microbatch;
        double ready = 0, cost = 0;
        if (a.kind == pipe::ActionKind::Forward) {
          if (s > 0) ready = forward_end[at(s - 1, mb)];
          cost = f[size_t(s)];
        } else if (a.kind == pipe::ActionKind::BackwardWeight) {
          ready = backward_end[at(s, mb)];
          cost = bw[size_t(s)];
        } else {
          if (s < n - 1) ready = backward_end[at(s + 1, mb)];
          cost = a.kind == pipe::ActionKind::Backward ? b[size_t(s)] : bi[size_t(s)];
        }
        if (ready < 0) break;  // its input is not produced yet: another rank's turn
        const double end = std::max(free_at[size_t(r)], ready) + cost;
        if (a.kind == pipe::ActionKind::Forward) {
          forward_end[at(s, mb)] = end;
        } else if (a.kind != pipe::ActionKind::BackwardWeight) {
          backward_end[at(s, mb)] = end;  // what stage s - 1's backward waits for
        }
        free_at[size_t(r)] = end;
        busy[size_t(r)] += cost;
        progress = true;
      }
    }
  }
  for (int64_t r = 0; r < pp; ++r)
    MT_CHECK(next[size_t(r)] == schedule.ranks[size_t(r)].size(),
             "pipeline_bench: the per-stage simulation of ", pipe::schedule_kind_name(schedule.kind),
             " did not finish rank ", r);
  const double makespan = *std::max_element(free_at.begin(), free_at.end());
  std::vector<double> bubble;
  for (double x : busy) bubble.push_back(makespan > 0 ? (makespan - x) / makespan : 0.0);
  return bubble;
}

// "a / b / c" with each value formatted by fmt.
template <class T>
std::string joined(const std::vector<T>& values, const char* fmt) {
  std::string s;
  char buf[64];
  for (size_t i = 0; i < values.size(); ++i) {
    std::snprintf(buf, sizeof buf, fmt, values[i]);
    s += (i ? " / " : "") + std::string(buf);
  }
  return s;
}

void run_schedule(const std::string& name, const Options& o,
                  const std::shared_ptr<parallel::ProcessGroup>& world,
                  const models::llama::ModelArgs& args) {
  const int64_t pp = world->size(), rank = world->rank();
  const pipe::ScheduleKind kind = pipe::parse_schedule_kind(name);
  const int64_t v = pipe::is_interleaved(kind) ? o.v : 1;
  const pipe::PipelineSchedule schedule = pipe::make_schedule(kind, pp, v, o.microbatches);
  const int64_t n = schedule.num_stages(), m = o.microbatches;
  const std::vector<pipe::LayerSplit> ranges =
      pipe::stage_layer_ranges(args.n_layers, n, 0, {});
  if (o.render && rank == 0) std::printf("%s\n", pipe::render_schedule(schedule).c_str());

  // This rank's stages, built alone with the whole model's initial values.
  std::vector<pipe::LocalStage> local;
  std::vector<std::shared_ptr<models::llama::Transformer>> modules;
  std::map<const runtime::nn::Module*, int64_t> stage_of;
  for (int64_t s = 0; s < n; ++s) {
    if (pipe::stage_rank(s, pp) != rank) continue;
    const auto& r = ranges[size_t(s)];
    modules.push_back(std::make_shared<models::llama::Transformer>(
        args, /*seed=*/0, runtime::TensorOptions{}, models::llama::LayerRange{r.begin, r.end}));
    local.push_back({s, modules.back()});
    stage_of[modules.back().get()] = s;
  }

  // Random tokens, the same on every rank (rank 0 reads the inputs, the last rank the labels).
  std::vector<Tensor> inputs, labels;
  for (int64_t i = 0; i < m; ++i) {
    Tensor u =
        runtime::rand({o.mb, o.seq + 1}, runtime::RandomKey(1, "pipeline_bench", uint64_t(i)));
    Tensor tokens = runtime::mul(u, double(args.vocab_size) - 1e-6).to(runtime::DType::I64);
    inputs.push_back(tokens.narrow(1, 0, o.seq).contiguous());
    labels.push_back(tokens.narrow(1, 1, o.seq).contiguous());
  }
  const double tokens = double(m * o.mb * o.seq);

  // Seconds in each stage's forwards (the last stage's loss included), over the timed steps.
  // Their CPU seconds too: wall / CPU shows how much sharing a core stretched them.
  std::vector<double> forward_s(size_t(n), 0.0);
  double forward_cpu_s = 0;
  bool timing = false;
  pipe::StageFunctions functions;
  functions.forward = [&](runtime::nn::Module& stage, const Tensor& x) {
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_seconds();
    Tensor y = dynamic_cast<models::llama::Transformer&>(stage).stage_forward(x);
    if (timing) {
      forward_s[size_t(stage_of.at(&stage))] += seconds_since(t0);
      forward_cpu_s += thread_cpu_seconds() - c0;
    }
    return pipe::StageOutput{y, Tensor()};
  };
  functions.loss = [&](const Tensor& logits, int64_t microbatch) {
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_seconds();
    Tensor loss = runtime::mul(runtime::cross_entropy(logits, labels.at(size_t(microbatch)), -100,
                                                      runtime::Reduction::Sum),
                               1.0 / tokens);
    if (timing) {
      forward_s[size_t(n - 1)] += seconds_since(t0);
      forward_cpu_s += thread_cpu_seconds() - c0;
    }
    return loss;
  };
  pipe::PipelineRunner runner(schedule, world, std::move(local), std::move(functions),
                              {o.mb, o.seq, args.dim}, runtime::TensorOptions{});

  auto zero_grads = [&] {
    for (const auto& mod : modules) mod->zero_grad(/*set_to_none=*/false);
  };
  for (int64_t i = 0; i < o.warmup; ++i) {  // also allocates the gradients, kept from here on
    zero_grads();
    world->barrier("pipeline_bench.warmup");
    runner.step(inputs);
  }
  double step_s = 0, busy_s = 0, makespan_s = 0, peak_bytes = 0;
  const runtime::Device cpu = runtime::Device::cpu();
  timing = true;
  for (int64_t i = 0; i < o.steps; ++i) {
    zero_grads();
    world->barrier("pipeline_bench.step");
    const int64_t before = runtime::memory_stats(cpu).bytes_in_use;
    runtime::reset_peak_memory(cpu);
    runner.step(inputs);
    const int64_t peak = runtime::memory_stats(cpu).peak_bytes_in_use;
    const pipe::PipelineStepTiming& t = runner.last_step_timing();
    step_s += t.step_seconds;
    busy_s += t.busy_seconds;
    peak_bytes = std::max(peak_bytes, double(peak - before));
    // The pipeline's step: every rank started at the barrier, the slowest one ends it.
    const std::vector<double> steps =
        parallel::all_gather_values(*world, {t.step_seconds}, "pipeline_bench.step_time");
    makespan_s += *std::max_element(steps.begin(), steps.end());
  }
  timing = false;

  // Each rank's numbers, then its stages' forward seconds (zero for the stages it lacks).
  std::vector<double> mine = {step_s, busy_s, peak_bytes, forward_cpu_s};
  mine.insert(mine.end(), forward_s.begin(), forward_s.end());
  const size_t width = mine.size();
  const std::vector<double> all =
      parallel::all_gather_values(*world, mine, "pipeline_bench.results");
  if (rank != 0) return;

  const double steps = double(o.steps);
  std::vector<double> own, global, busy_per_step, peak_mib, stretch;
  // Per stage and action, the mean seconds: a forward (with the loss on the last stage) and a
  // backward, the rank's backward time (busy minus forwards) shared among its stages in
  // proportion to their forward time.
  std::vector<double> f(static_cast<size_t>(n)), b(f), bi(f), bw(f);
  for (int64_t r = 0; r < pp; ++r) {
    const double* x = &all[size_t(r) * width];
    own.push_back(x[0] > 0 ? 1.0 - x[1] / x[0] : 0.0);
    global.push_back(makespan_s > 0 ? 1.0 - x[1] / makespan_s : 0.0);
    busy_per_step.push_back(x[1] / steps);
    peak_mib.push_back(x[2] / (1024.0 * 1024.0));
    const double* stage_forward = x + 4;
    double rank_forward = 0;
    for (int64_t s = 0; s < n; ++s) rank_forward += stage_forward[s];
    stretch.push_back(x[3] > 0 ? rank_forward / x[3] : 0.0);
    for (int64_t s = 0; s < n; ++s) {
      if (pipe::stage_rank(s, pp) != r) continue;
      f[size_t(s)] = stage_forward[s] / (steps * double(m));
      b[size_t(s)] =
          (x[1] - rank_forward) * (stage_forward[s] / rank_forward) / (steps * double(m));
      // Zero bubble: the runner does not time the two halves apart; assume an even split
      // (stage 0 has no input gradient: all of its backward is weight work).
      bi[size_t(s)] = s == 0 ? 0.0 : b[size_t(s)] / 2;
      bw[size_t(s)] = b[size_t(s)] - bi[size_t(s)];
    }
  }
  std::vector<double> f_ms, b_ms;
  for (int64_t s = 0; s < n; ++s) {
    f_ms.push_back(f[size_t(s)] * 1e3);
    b_ms.push_back(b[size_t(s)] * 1e3);
  }
  const pipe::ScheduleTiming sim_unit = pipe::simulate_schedule(schedule);
  const std::vector<double> sim_stage = simulate_per_stage(schedule, f, b, bi, bw);
  {  // The per-stage simulation with the theory's costs must be simulate_schedule's.
    const std::vector<double> one(size_t(n), 1.0), two(size_t(n), 2.0);
    const std::vector<double> check = simulate_per_stage(schedule, one, two, one, one);
    for (int64_t r = 0; r < pp; ++r)
      MT_CHECK(std::abs(check[size_t(r)] - sim_unit.bubble_fraction[size_t(r)]) < 1e-9,
               "pipeline_bench: the per-stage simulation disagrees with simulate_schedule on rank ",
               r, ": ", check[size_t(r)], " vs ", sim_unit.bubble_fraction[size_t(r)]);
  }
  std::printf("| %s | %lld | %lld | %lld | %.3f | %s | %s | %s | %s | %s | %.3f | %s | %s | %s |\n",
              pipe::schedule_kind_name(kind), (long long)pp, (long long)v, (long long)m,
              makespan_s / steps, joined(busy_per_step, "%.3f").c_str(),
              joined(own, "%.3f").c_str(), joined(global, "%.3f").c_str(),
              joined(sim_unit.bubble_fraction, "%.3f").c_str(),
              joined(sim_stage, "%.3f").c_str(), pipe::theoretical_bubble_fraction(kind, pp, v, m),
              joined(peak_mib, "%.1f").c_str(), joined(max_in_flight(schedule), "%lld").c_str(),
              joined(stretch, "%.2f").c_str());
  if (o.verbose)
    std::printf("|   | per stage: f (ms) %s; b (ms) %s |\n", joined(f_ms, "%.1f").c_str(),
                joined(b_ms, "%.1f").c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  tools::FlagReader flags("pipeline_bench", argc, argv);
  while (flags.next()) {
    if (flags.is("--microbatches")) o.microbatches = flags.int_value();
    else if (flags.is("--steps")) o.steps = flags.int_value();
    else if (flags.is("--warmup")) o.warmup = flags.int_value();
    else if (flags.is("--v")) o.v = flags.int_value();
    else if (flags.is("--dim")) o.dim = flags.int_value();
    else if (flags.is("--layers")) o.layers = flags.int_value();
    else if (flags.is("--heads")) o.heads = flags.int_value();
    else if (flags.is("--seq")) o.seq = flags.int_value();
    else if (flags.is("--mb")) o.mb = flags.int_value();
    else if (flags.is("--vocab")) o.vocab = flags.int_value();
    else if (flags.is("--schedules")) o.schedules = flags.value();
    else if (flags.is("--render")) o.render = true;
    else if (flags.is("--verbose")) o.verbose = true;
    else flags.unknown();
  }
  auto world = std::shared_ptr<parallel::ProcessGroup>(parallel::MpiProcessGroup::world());
  MT_CHECK(o.steps >= 1 && o.warmup >= 0, "pipeline_bench: --steps must be >= 1 and --warmup >= 0");

  models::llama::ModelArgs args = models::llama::flavor_args("debugmodel");
  args.dim = o.dim;
  args.n_layers = o.layers;
  args.n_heads = o.heads;
  args.n_kv_heads = o.heads;
  args.vocab_size = o.vocab;
  args.max_seq_len = o.seq;
  args.validate();

  if (world->rank() == 0) {
    const auto counts = models::llama::count_parameters(args);
    std::printf("pipeline_bench: pp %lld, llama dim %lld, %lld layers, %lld heads, ffn %lld, vocab "
                "%lld (%.1fM params), seq %lld, micro-batch %lld, %lld micro-batches, f32; %lld "
                "warm-up + %lld timed steps per schedule\n\n",
                (long long)world->size(), (long long)args.dim, (long long)args.n_layers,
                (long long)args.n_heads, (long long)args.ffn_hidden_dim(),
                (long long)args.vocab_size, double(counts.total) / 1e6, (long long)o.seq,
                (long long)o.mb, (long long)o.microbatches, (long long)o.warmup,
                (long long)o.steps);
    std::printf("| schedule | pp | v | m | step (s) | busy per rank (s) | bubble per rank: "
                "runner (own step) | measured vs pipeline step | simulated (f 1, b 2) | "
                "simulated (measured stage costs) | theory | peak activations per rank (MiB) | "
                "max in flight per rank | forward wall / CPU per rank |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- | ---: | --- | "
                "--- | --- |\n");
    std::fflush(stdout);
  }
  for (const std::string& name : split_commas(o.schedules)) {
    try {
      run_schedule(name, o, world, args);
    } catch (const Error& e) {
      // Shape errors (layers that do not split, a micro-batch count a schedule refuses) come
      // before any communication and alike on every rank: report and go on.
      if (world->rank() == 0) std::printf("| %s | skipped: %s |\n", name.c_str(), e.what());
    }
  }
  return 0;
}
