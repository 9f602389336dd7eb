// RunScaffold: what every trainer's train() does around its steps, written once for the language
// model Trainer and the RecsysTrainer: [training] deterministic (runtime/core/determinism.h) for
// the run, the SIGINT/SIGTERM/SIGUSR1 stop request, metrics.jsonl, the [profiling] of every
// profile_freq-th step, the [comm] trace of every step, the end of each step (a checkpoint when due, a stop agreed by every rank)
// and the end of the run (the background save awaited, a preempted job requeued, loss.svg, the
// summary line).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "parallel/comm/comm_report.h"
#include "runtime/core/determinism.h"
#include "runtime/core/device.h"
#include "train/config/job_config.h"
#include "train/train_result.h"

namespace mt::parallel {
class ProcessGroup;
}

namespace mt::train {

class JsonlWriter;
class StopRequest;
class TensorBoardWriter;
struct StepMetrics;
class TrainCheckpointer;
struct TrainerOptions;

// "8 threads (OMP_WAIT_POLICY=PASSIVE)": the CPU threads of the run, for the log.
std::string cpu_threads_text();

// Seconds from t0 to now (steady clock).
double seconds_since(std::chrono::steady_clock::time_point t0);

// Sum of `value` over every rank of `group` (the value itself on one rank). Collective.
double sum_over_ranks(parallel::ProcessGroup& group, double value, const char* name);

class RunScaffold {
 public:
  // Installs the stop request (options.handle_signals) and opens metrics.jsonl and the
  // TensorBoard event file (with options.write_files, and metrics.save_jsonl or
  // metrics.enable_tensorboard). `checkpointer` may be null.
  RunScaffold(const config::JobConfig& config, const TrainerOptions& options,
              parallel::ProcessGroup& world, TrainCheckpointer* checkpointer, std::ostream& out);
  ~RunScaffold();

  // A logged step's metrics, and other values of a step (validation: val_loss, auc), to
  // metrics.jsonl and TensorBoard where they are written.
  void log_step(const StepMetrics& m);
  void log_values(int64_t step, const std::vector<std::pair<std::string, double>>& values);

  // Around a training step's work (not its logging or validation): with profiling.enable, every
  // profile_freq-th step is recorded by the op profiler (runtime/core/profiler.h), its kernels
  // on `device` timed there. The log gets the summary (where the step's time went); rank 0
  // writes a Chrome trace to <dump_folder>/<save_traces_folder>/step_<N>.json.
  // With [profiling] execution_trace, every rank writes each profiled step's execution trace
  // (parallel/comm/execution_trace.h) to <dump_folder>/<save_traces_folder>/execution_trace/.
  // With [comm] trace (on every rank), each step's collectives and its exposed communication go
  // to <dump_folder>/comm/rank-N.jsonl (parallel/comm/comm_trace.h), the collectives of a
  // profiled step into its Chrome trace as a track per group, and finish() prints the summary.
  void profile_begin(int64_t step, runtime::Device device);
  void profile_end(int64_t step);
  // The share of the time since the last call that the training thread was blocked in
  // collectives; nullopt without [comm] trace.
  std::optional<double> take_comm_exposed_fraction();

  // Collective. After step `step` (`seen`: tokens or samples so far): saves when due; returns
  // true when the run stops here because any rank was asked to (logged, result marked).
  bool end_of_step(int64_t step, int64_t seen, TrainResult& result);

  // Waits for a background save, requeues a preempted SLURM job ([job] requeue_on_preemption,
  // see train/job_requeue.h), sets result.seconds, plots loss.svg and logs the summary line (no
  // newline: a trainer may add to it).
  void finish(TrainResult& result);

  double elapsed_seconds() const { return seconds_since(start_); }  // since construction

 private:
  const config::JobConfig& config_;
  runtime::DeterministicAlgorithmsGuard deterministic_;  // restored when the run ends
  bool write_files_;
  parallel::ProcessGroup& world_;
  TrainCheckpointer* checkpointer_;
  std::ostream& out_;
  std::unique_ptr<StopRequest> stop_;
  std::unique_ptr<JsonlWriter> jsonl_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  bool profiling_step_ = false;
  bool tracing_step_comm_ = false;  // CommTrace on for a profiled step's execution trace only
  // [comm] trace: this rank's trace file, the run's summary, the exposed time of the log window.
  std::unique_ptr<std::ofstream> comm_file_;
  parallel::CommSummary comm_summary_;
  double window_exposed_s_ = 0, window_traced_s_ = 0;
  std::chrono::steady_clock::time_point last_comm_take_ = std::chrono::steady_clock::now();
  // Writes and sums the collectives since the last take (the step, and what ran between it and
  // the step before: the stop check, logged metrics) and returns them.
  std::vector<parallel::CommRecord> take_step_comm(int64_t step);
  bool preempted_ = false;  // the run stopped on a SIGUSR1 (a scheduler's preemption warning)
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace mt::train
