// The dense optimizer and the learning-rate schedule a job config asks for ([optimizer],
// [lr_scheduler]), built the same way for every trainer (language models and recsys models).
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"
#include "train/config/sections.h"

namespace mt::runtime::optim {
class Optimizer;
class LRScheduler;
}  // namespace mt::runtime::optim

namespace mt::train {

// AdamW or SGD (optimizer.name) over `params` (name, parameter).
std::unique_ptr<runtime::optim::Optimizer> make_optimizer(
    const config::OptimizerConfig& config,
    const std::vector<std::pair<std::string, runtime::Tensor>>& params);

// Warmup-stable-decay over `total_steps` optimizer steps (training.steps). A warmup longer than
// the run is clamped to it, as torchtitan does, and one line says so on `log` (the trainer's
// rank-0 log; nullptr: nowhere):
//   warning: [lr_scheduler] warmup_steps = 20 exceeds [training] steps = 4: warming up over 4 steps
std::unique_ptr<runtime::optim::LRScheduler> make_lr_scheduler(
    const config::LRSchedulerConfig& config, runtime::optim::Optimizer& optimizer,
    int64_t total_steps, std::ostream* log = nullptr);

}  // namespace mt::train
