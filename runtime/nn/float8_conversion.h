// Float8 training for a model's linear layers (torchao's convert_to_float8_training): marks each
// nn::Linear of a module tree to run its GEMMs in FP8 (runtime/ops/float8.h), except those whose
// fully qualified name contains one of `filter_fqns` (torchtitan's filter, e.g. "output") and those
// float8 cannot run (float8_linear_unsupported: dimensions not multiples of 16), which stay in
// their own precision and are listed with the reason.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/nn/module.h"
#include "runtime/ops/float8_recipe.h"

namespace mt::runtime::nn {

struct Float8Conversion {
  std::vector<std::string> converted;                         // FQNs of the linears now float8
  std::vector<std::pair<std::string, std::string>> skipped;   // FQN, why it stays as it was
};

// Converts in place to `recipe`; `device` is where the model will run (the GEMMs' rules are the
// device's). A device without FP8 GEMMs is an error naming it. Idempotent.
Float8Conversion convert_linears_to_float8(Module& root, Device device,
                                           const std::vector<std::string>& filter_fqns,
                                           Float8Recipe recipe = Float8Recipe::Tensorwise);

}  // namespace mt::runtime::nn
