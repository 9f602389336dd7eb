// Float8 training in the trainer ([quantize.linear.float8], torchtitan's float8 converter): the
// device check and the conversion of a model's linear layers (runtime/nn/float8_conversion.h),
// applied to the model as built, before it is parallelized (torchtitan converts before
// parallelism too), and the one log line that says what was converted.
//
// A CPU trains in float8 only with emulate = true (the exact CPU reference, for tests and
// debugging); a GPU needs FP8 tensor cores (compute capability 8.9 or newer). Both are errors
// naming the device, found before the data is prepared.
#pragma once

#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/nn/float8_conversion.h"
#include "runtime/nn/module.h"
#include "train/config/job_config.h"

namespace mt::train {

// Fails when float8 is enabled and `device` (training.device as resolved, "auto" included)
// cannot run it; nothing when float8 is off.
void check_float8_device(const config::JobConfig& job, runtime::Device device);

// Converts `model`'s linears to float8 as job.float8 asks (enable must be true) and returns the
// log line, e.g. "float8: 112 linears (tensorwise), 1 left in bfloat16: output (filtered)".
std::string apply_float8_training(runtime::nn::Module& model, const config::JobConfig& job,
                                  runtime::Device device);
// The same for several modules (a rank's pipeline stages), one log line for all of them.
std::string apply_float8_training(const std::vector<runtime::nn::Module*>& modules,
                                  const config::JobConfig& job, runtime::Device device);

// The log line of a conversion: converted count and recipe, then the linears left in
// `high_precision` (the compute dtype) grouped by reason, a few names per reason.
std::string float8_conversion_text(const runtime::nn::Float8Conversion& conversion,
                                   const std::string& recipe, const std::string& high_precision);

}  // namespace mt::train
