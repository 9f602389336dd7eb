// Dense optimizer and schedule from the config (see optimizer_setup.h).
#include "train/optimizer_setup.h"

#include "runtime/optim/adamw.h"
#include "runtime/optim/lr_scheduler.h"
#include "runtime/optim/sgd.h"

namespace mt::train {

std::unique_ptr<runtime::optim::Optimizer> make_optimizer(
    const config::OptimizerConfig& config,
    const std::vector<std::pair<std::string, runtime::Tensor>>& params) {
  if (config.name == "SGD") {
    runtime::optim::SGDOptions so;
    so.lr = config.lr;
    so.weight_decay = config.weight_decay;
    return std::make_unique<runtime::optim::SGD>(params, so);
  }
  runtime::optim::AdamWOptions ao{config.lr, config.beta1, config.beta2, config.eps,
                                  config.weight_decay};
  return std::make_unique<runtime::optim::AdamW>(params, ao);
}

std::unique_ptr<runtime::optim::LRScheduler> make_lr_scheduler(
    const config::LRSchedulerConfig& config, runtime::optim::Optimizer& optimizer,
    int64_t total_steps, std::ostream* log) {
  if (log && config.warmup_steps > total_steps) {
    *log << "warning: [lr_scheduler] warmup_steps = " << config.warmup_steps
         << " exceeds [training] steps = " << total_steps << ": warming up over " << total_steps
         << " steps\n";
  }
  runtime::optim::WarmupStableDecay wsd;
  wsd.warmup_steps = config.warmup_steps;
  wsd.decay_ratio = config.decay_ratio;
  wsd.decay_type = runtime::optim::decay_type_from_name(config.decay_type);
  wsd.min_lr_factor = config.min_lr_factor;
  return std::make_unique<runtime::optim::LRScheduler>(optimizer, total_steps, wsd);
}

}  // namespace mt::train
