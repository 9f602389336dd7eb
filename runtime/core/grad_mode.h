// Grad mode: whether ops record the autograd graph (thread-local, on by default).
#pragma once

namespace mt::runtime {

class GradMode {
 public:
  static bool enabled();
  static void set_enabled(bool enabled);
};

// RAII: disables graph recording in this scope (e.g. optimizer steps, evaluation).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// RAII: enables graph recording in this scope (activation checkpointing's recompute).
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace mt::runtime
