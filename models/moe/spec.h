// The registry entry of the MoE transformer, model name "deepseek_v3": a ModelSpec for a flavor
// of models/moe/model_args.h (moe_debug, 16B, 671B). Its args hold a moe::ModelArgs.
//
// loss: token cross-entropy plus, while grad mode is on (training) and aux_loss_alpha > 0, the
// MoE layers' auxiliary balance loss -- times the number of valid targets under Reduction::Sum,
// so that the trainer's sum / (valid tokens of the step) adds the token-weighted mean of the
// micro-batches' auxiliary losses. Evaluation (no_grad) reports the cross-entropy alone.
// after_optimizer_step: update_expert_bias (models/moe/load_balancing.h).
// parallelize: FSDP on the data-parallel mesh, routed experts split over ep and sharded on the
// expert mesh (models/moe/parallelize.h).
#pragma once

#include <string>

#include "models/registry.h"

namespace mt::models::moe {

// Throws mt::Error listing the valid flavors when `flavor` is unknown.
ModelSpec make_model_spec(const std::string& flavor);

}  // namespace mt::models::moe
