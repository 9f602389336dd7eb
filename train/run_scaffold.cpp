// RunScaffold (see run_scaffold.h).
#include "train/run_scaffold.h"

#include <omp.h>

#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "parallel/comm/comm_trace.h"
#include "parallel/comm/execution_trace.h"
#include "parallel/comm/process_group.h"
#include "runtime/core/profiler.h"
#include "runtime/ops/factory.h"
#include "train/checkpointer.h"
#include "train/job_requeue.h"
#include "train/metrics/jsonl_writer.h"
#include "train/metrics/tensorboard_writer.h"
#include "train/signals.h"
#include "train/trainer.h"

namespace mt::train {

namespace fs = std::filesystem;

std::string cpu_threads_text() {
  const auto value = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(name) + "=" + (v != nullptr ? v : "unset");
  };
  const int threads = omp_get_max_threads();
  return std::to_string(threads) + (threads == 1 ? " thread (" : " threads (") +
         value("OMP_WAIT_POLICY") + ", " +
         value("OPENBLAS_THREAD_TIMEOUT") + ")";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double sum_over_ranks(parallel::ProcessGroup& group, double value, const char* name) {
  if (group.size() == 1) return value;
  runtime::Tensor t = runtime::from_vector<double>({value}, {1}, {runtime::DType::F64});
  group.all_reduce(t, parallel::ReduceOp::Sum, name);
  return t.item<double>();
}

RunScaffold::RunScaffold(const config::JobConfig& config, const TrainerOptions& options,
                         parallel::ProcessGroup& world, TrainCheckpointer* checkpointer,
                         std::ostream& out)
    : config_(config),
      deterministic_(config.training.deterministic),
      write_files_(options.write_files),
      world_(world),
      checkpointer_(checkpointer),
      out_(out) {
  if (options.handle_signals) stop_ = std::make_unique<StopRequest>();
  const fs::path dump(config_.job.dump_folder);
  if (write_files_ && config_.metrics.save_jsonl) {
    fs::create_directories(dump);
    jsonl_ = std::make_unique<JsonlWriter>((dump / "metrics.jsonl").string());
  }
  if (write_files_ && config_.metrics.enable_tensorboard) {
    tensorboard_ =
        std::make_unique<TensorBoardWriter>((dump / config_.metrics.save_tb_folder).string());
  }
  if (config_.comm.trace) {  // every rank writes its own records
    const fs::path dir = dump / "comm";
    fs::create_directories(dir);
    const fs::path file = dir / parallel::rank_file_name(world_.rank(), ".jsonl");
    comm_file_ = std::make_unique<std::ofstream>(file, std::ios::app);
    MT_CHECK(comm_file_->good(), "[comm] trace: cannot write ", file.string());
    parallel::CommTrace::start();
  }
}

void RunScaffold::log_step(const StepMetrics& m) {
  if (jsonl_) jsonl_->write(m);
  if (tensorboard_) tensorboard_->add_scalars(m.step, tensorboard_scalars(m));
}

void RunScaffold::log_values(int64_t step,
                             const std::vector<std::pair<std::string, double>>& values) {
  if (jsonl_) {
    JsonObject o;
    o.add("step", step);
    for (const auto& [name, value] : values) o.add(name, value);
    jsonl_->write(o);
  }
  if (tensorboard_) tensorboard_->add_scalars(step, values);
}

RunScaffold::~RunScaffold() {
  if (config_.comm.trace || tracing_step_comm_) parallel::CommTrace::stop();
  if (!profiling_step_) return;
  try {
    (void)runtime::Profiler::stop();  // a step that threw: close its session
  } catch (...) {                     // the step's own error is the one to report
  }
}

void RunScaffold::profile_begin(int64_t step, runtime::Device device) {
  const config::ProfilingConfig& p = config_.profiling;
  profiling_step_ = p.enable && step % p.profile_freq == 0;
  if (!profiling_step_) return;
  runtime::Profiler::start(device, p.execution_trace);
  if (p.execution_trace && !config_.comm.trace) {  // the step's collectives, for its trace
    parallel::CommTrace::start();
    tracing_step_comm_ = true;
  }
}

void RunScaffold::profile_end(int64_t step) {
  std::vector<parallel::CommRecord> collectives;
  if (config_.comm.trace) {
    collectives = take_step_comm(step);
  } else if (tracing_step_comm_) {
    collectives = parallel::CommTrace::take();
    parallel::CommTrace::stop();
    tracing_step_comm_ = false;
  }
  if (!profiling_step_) return;
  profiling_step_ = false;
  const runtime::ProfileReport report = runtime::Profiler::stop();
  out_ << "profile of step " << step << ": " << report.summary();
  if (config_.profiling.execution_trace) {  // every rank writes its own
    const fs::path dir = fs::path(config_.job.dump_folder) / config_.profiling.save_traces_folder /
                         "execution_trace" / ("step_" + std::to_string(step));
    fs::create_directories(dir);
    parallel::write_execution_trace(
        parallel::make_execution_trace(report, collectives, world_.rank(), world_.size(), step),
        (dir / parallel::rank_file_name(world_.rank(), ".json")).string());
    out_ << "  execution trace: " << dir.string() << " (mt_replay replays it)\n";
  }
  if (write_files_) {
    const fs::path dir = fs::path(config_.job.dump_folder) / config_.profiling.save_traces_folder;
    fs::create_directories(dir);
    const fs::path trace = dir / ("step_" + std::to_string(step) + ".json");
    // The step's collectives, a track per group after the host's (tid 0) and device's (tid 1).
    report.write_chrome_trace(
        trace.string(), parallel::comm_chrome_events(collectives, 0, report.wall_start_us, 2));
    out_ << "  trace: " << trace.string() << "\n";
  }
  out_ << std::flush;
}

std::vector<parallel::CommRecord> RunScaffold::take_step_comm(int64_t step) {
  std::vector<parallel::CommRecord> records = parallel::CommTrace::take();
  const double exposed = parallel::CommTrace::take_exposed_seconds();
  const double seconds = seconds_since(last_comm_take_);
  last_comm_take_ = std::chrono::steady_clock::now();
  const int rank = world_.rank();
  for (const parallel::CommRecord& r : records) {
    comm_summary_.add(r);
    *comm_file_ << parallel::comm_record_json(r, step, rank) << '\n';
  }
  *comm_file_ << parallel::comm_step_json({step, rank, seconds, exposed}) << '\n';
  comm_file_->flush();
  MT_CHECK(comm_file_->good(), "[comm] trace: writing ", config_.job.dump_folder,
           "/comm/rank-", rank, ".jsonl failed");
  comm_summary_.add_step(seconds, exposed);
  window_exposed_s_ += exposed;
  window_traced_s_ += seconds;
  return records;
}

std::optional<double> RunScaffold::take_comm_exposed_fraction() {
  if (!config_.comm.trace) return std::nullopt;
  const double share = window_traced_s_ > 0 ? window_exposed_s_ / window_traced_s_ : 0.0;
  window_exposed_s_ = window_traced_s_ = 0;
  return share;
}

bool RunScaffold::end_of_step(int64_t step, int64_t seen, TrainResult& result) {
  // Every rank stops at the same step when any of them was asked to; a SIGUSR1 on any rank (the
  // scheduler's preemption warning) makes it a preemption. One all-reduce of both flags.
  const bool asked = stop_ && stop_->stop_requested();
  const bool warned = asked && stop_->signal_number() == SIGUSR1;
  runtime::Tensor flags = runtime::from_vector<double>({asked ? 1.0 : 0.0, warned ? 1.0 : 0.0},
                                                       {2}, {runtime::DType::F64});
  if (world_.size() > 1) world_.all_reduce(flags, parallel::ReduceOp::Sum, "train.stop");
  const std::vector<double> agreed = flags.to_vector<double>();
  const bool stop_here = agreed[0] > 0;
  preempted_ = agreed[1] > 0;
  const int64_t steps = config_.training.steps;
  if (checkpointer_) checkpointer_->after_step(step, seen, step == steps, stop_here, out_);
  if (stop_here) {
    result.stopped_by_signal = true;
    out_ << "stopped by " << (stop_ ? stop_->cause() : "a stop request") << " at the end of step "
         << step << " of " << steps << "\n"
         << std::flush;
  }
  return stop_here;
}

void RunScaffold::finish(TrainResult& result) {
  if (checkpointer_) checkpointer_->finish();
  // The stop's checkpoint is complete (every rank's save awaited): a preempted job may go back
  // to the queue, and resumes from it when it starts again.
  if (preempted_ && config_.job.requeue_on_preemption && world_.rank() == 0) requeue_job(out_);
  result.seconds = elapsed_seconds();
  const fs::path dump(config_.job.dump_folder);
  if (write_files_ && config_.metrics.plot)
    plot_losses(result, dump / "loss.svg", config_.job.description + ": loss");
  if (!comm_summary_.empty()) {
    out_ << "communication of rank " << world_.rank() << " (" << (dump / "comm").string()
         << ", mt_comm_report summarises every rank):\n"
         << comm_summary_.text();
  }
  log_summary(result, write_files_ ? dump : fs::path(), out_);
}

}  // namespace mt::train
