// StepMetrics: what the trainer logs for one optimizer step, and the one-line human format:
//
//   step  120  loss  3.4521  grad_norm    1.23  lr 3.0e-04  tok/s/rank    12,345  total    49,380
//     mfu  41.2%  mem  1.2/1.5 GiB  data  2%  eta 3m12s
//
// (one line; wrapped here). Every field has a fixed width so the columns of successive lines
// align: step is right-aligned to `step_width` digits (use step_width_for(total_steps)), loss has 4
// decimals, grad_norm 2 (scientific outside [0.01, 1e5)), lr 1 (scientific), tok/s/rank (per
// rank, as torchtitan's tps; samples/s/rank for recsys models) has thousands separators and on
// more than one rank is followed by the job's total, memory is "in-use/peak" in MiB (under 1 GiB
// of peak) or GiB, data is the share of the step spent waiting for data, comm (when [comm]
// trace is on) the share blocked in collectives not overlapped by compute, eta is compact ("45s",
// "3m12s", "2h05m", "3d04h"). Unknown values (no peak FLOPs, no memory stats, ETA during warmup)
// print as "n/a", non-finite ones as "nan"/"inf".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace mt::train {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0.0;
  double grad_norm = 0.0;
  double lr = 0.0;
  double tokens_per_sec = 0.0;  // the throughput per rank: tokens/s, or samples/s for recsys
  bool rate_in_samples = false;  // the throughput counts samples ("samples/s", samples_per_sec)
  int64_t ranks = 1;             // ranks of the job: its total throughput is tokens_per_sec x this
  std::optional<double> mfu;  // fraction in [0, 1]; nullopt when the device peak is unknown
  std::optional<int64_t> mem_in_use_bytes;
  std::optional<int64_t> mem_peak_bytes;
  double data_wait_fraction = 0.0;  // share of the step's wall time spent waiting for data
  // Share of the step the training thread was blocked in collectives ([comm] trace only).
  std::optional<double> comm_exposed_fraction;
  double elapsed_sec = 0.0;         // since the start of training
  std::optional<double> eta_sec;    // nullopt while the estimator warms up
  // The model's own metrics (e.g. moe_load_imbalance), logged after the others by name.
  std::map<std::string, double> model_metrics;
};

// The throughput's name in metrics.jsonl and TensorBoard: "tokens_per_sec" or "samples_per_sec"
// (per rank); the job's total is the same name + "_total".
std::string rate_name(const StepMetrics& m);

// The human-readable line (no trailing newline).
std::string format_step_line(const StepMetrics& m, int step_width = 4);
// Digits of `total_steps` (at least 4), for format_step_line.
int step_width_for(int64_t total_steps);

// Helpers used by the line, exposed for other logs.
std::string format_thousands(int64_t value);              // 12345 -> "12,345"
std::string format_duration(double seconds);              // 192 -> "3m12s"; "n/a" if < 0/NaN
std::string format_memory(int64_t in_use, int64_t peak);  // "1.2/1.5 GiB", "512/768 MiB"

}  // namespace mt::train
