// The registry entry of the Llama 3 model: a ModelSpec for a flavor of models/llama/model_args.h,
// or for any Llama 3 shape from a saved architecture (a Hugging Face config.json).
#pragma once

#include <string>

#include "models/registry.h"

namespace mt::models::llama {

// Throws mt::Error listing the valid flavors when `flavor` is unknown.
ModelSpec make_model_spec(const std::string& flavor);
// From config.json text (what ModelSpec::architecture writes); errors name `where`.
ModelSpec make_model_spec_from_architecture(const std::string& text, const std::string& where);

}  // namespace mt::models::llama
