// TrainResult: what a training run returns (per-step losses and norms, held-out metrics), shared by
// the language-model Trainer and the RecsysTrainer, and the end-of-run outputs made from it: the
// loss plot (loss.svg) and the one-line summary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace mt::train {

struct TrainResult {
  std::vector<double> losses;      // per optimizer step, in order
  std::vector<double> grad_norms;  // per step, before clipping
  // Per step: the model's own metrics (after_optimizer_step, e.g. moe_load_imbalance).
  std::vector<std::map<std::string, double>> model_metrics;
  std::vector<std::pair<int64_t, double>> val_losses;  // (step, validation loss)
  std::vector<std::pair<int64_t, double>> val_aucs;    // (step, held-out ROC AUC): recsys models
  int64_t first_step = 1;  // the step losses[0] belongs to (> 1 when resumed from a checkpoint)
  int64_t steps_done = 0;  // the last step done
  bool stopped_by_signal = false;
  std::vector<int64_t> skipped_steps;  // non-finite steps skipped ([training] skip_nonfinite_steps)
  std::string sample;  // the generated text (prompt not included); empty if none
  double seconds = 0.0;
};

// Plots loss (and val_loss when there is one) against step into `svg`.
void plot_losses(const TrainResult& result, const std::filesystem::path& svg,
                 const std::string& title);

// "trained N steps (a to b) in 3m12s: loss x -> y; metrics and loss.svg in DIR" (no newline;
// `files_in` empty: nothing written).
void log_summary(const TrainResult& result, const std::filesystem::path& files_in,
                 std::ostream& out);

}  // namespace mt::train
