// Deterministic algorithms (torch.use_deterministic_algorithms): whether kernels must give the
// same bits on every run. Where a backend has a faster kernel whose result depends on the order
// in which its threads add up partial sums (cuDNN's attention backward), it runs that one only
// while this is off. CPU kernels have a fixed reduction order either way. Process-wide; on by
// default, so a library user gets reproducible results unless they opt out; `train` sets it from
// [training] deterministic for the run (DeterministicAlgorithmsGuard).
#pragma once

namespace mt::runtime {

bool deterministic_algorithms();
void set_deterministic_algorithms(bool on);

// RAII: sets the mode for a scope, then restores the previous one.
class DeterministicAlgorithmsGuard {
 public:
  explicit DeterministicAlgorithmsGuard(bool on) : prev_(deterministic_algorithms()) {
    set_deterministic_algorithms(on);
  }
  ~DeterministicAlgorithmsGuard() { set_deterministic_algorithms(prev_); }
  DeterministicAlgorithmsGuard(const DeterministicAlgorithmsGuard&) = delete;
  DeterministicAlgorithmsGuard& operator=(const DeterministicAlgorithmsGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace mt::runtime
