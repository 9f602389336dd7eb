#include "train/metrics/eta.h"

#include <cmath>

#include "runtime/core/error.h"

namespace mt::train {

EtaEstimator::EtaEstimator(int64_t total_steps, int64_t warmup_steps, size_t window)
    : total_steps_(total_steps), warmup_steps_(warmup_steps), window_(window) {
  MT_CHECK(window >= 1, "EtaEstimator: window must be >= 1, got ", window);
  MT_CHECK(warmup_steps >= 0, "EtaEstimator: warmup_steps must be >= 0, got ", warmup_steps);
  times_.reserve(window);
}

void EtaEstimator::record(double step_seconds) {
  if (!std::isfinite(step_seconds) || step_seconds < 0) return;
  if (recorded_++ < warmup_steps_) return;
  if (times_.size() < window_) {
    times_.push_back(step_seconds);
    sum_ += step_seconds;
    return;
  }
  sum_ += step_seconds - times_[next_];
  times_[next_] = step_seconds;
  next_ = (next_ + 1) % window_;
  // Recompute now and then so rounding errors of the running sum cannot accumulate.
  if (next_ == 0) {
    sum_ = 0.0;
    for (double t : times_) sum_ += t;
  }
}

std::optional<double> EtaEstimator::mean_step_seconds() const {
  if (times_.empty()) return std::nullopt;
  return sum_ / double(times_.size());
}

std::optional<double> EtaEstimator::eta(int64_t current_step) const {
  const auto mean = mean_step_seconds();
  if (!mean) return std::nullopt;
  const int64_t left = total_steps_ > current_step ? total_steps_ - current_step : 0;
  return *mean * double(left);
}

}  // namespace mt::train
