// The registry entry of the Llama 3 model: a ModelSpec for a flavor of models/llama/model_args.h.
#pragma once

#include <string>

#include "models/registry.h"

namespace mt::models::llama {

// Throws mt::Error listing the valid flavors when `flavor` is unknown.
ModelSpec make_model_spec(const std::string& flavor);

}  // namespace mt::models::llama
