// The dense optimizer and the learning-rate schedule a job config asks for ([optimizer],
// [lr_scheduler]), built the same way for every trainer (language models and recsys models).
#pragma once

#include <cstdint>
#include <memory>
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

// Warmup-stable-decay over `total_steps` optimizer steps.
std::unique_ptr<runtime::optim::LRScheduler> make_lr_scheduler(
    const config::LRSchedulerConfig& config, runtime::optim::Optimizer& optimizer,
    int64_t total_steps);

}  // namespace mt::train
