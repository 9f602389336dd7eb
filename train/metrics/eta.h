// ETA of a training run from a moving average of recent step times.
//
// The first `warmup_steps` recorded steps are ignored (they include one-off costs: allocator
// growth, first-touch page faults, on a GPU kernel autotuning); after them the estimate is
// mean(last `window` step times) * steps remaining. Until a step past the warmup is recorded,
// eta() is nullopt (printed "n/a"). Steps are counted from the first record(), so a resumed run
// warms up again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace mt::train {

class EtaEstimator {
 public:
  // total_steps: the step number training ends at; window >= 1.
  explicit EtaEstimator(int64_t total_steps, int64_t warmup_steps = 3, size_t window = 20);

  // The wall time of one step, in seconds (negative or non-finite times are ignored).
  void record(double step_seconds);
  // Seconds left after `current_step` has completed; nullopt during the warmup.
  std::optional<double> eta(int64_t current_step) const;
  // The moving average of step times (nullopt during the warmup).
  std::optional<double> mean_step_seconds() const;

 private:
  int64_t total_steps_;
  int64_t warmup_steps_;
  size_t window_;
  int64_t recorded_ = 0;
  std::vector<double> times_;  // ring buffer of the last `window_` step times
  size_t next_ = 0;
  double sum_ = 0.0;
};

}  // namespace mt::train
