// Float8 training in the trainer (torchtitan's float8 converters): [quantize.linear.float8]
// converts a model's linear layers (runtime/nn/float8_conversion.h), [quantize.grouped_mm.float8]
// its MoE routed experts' grouped GEMMs (models/moe/experts.h). Both apply to the model as built,
// before it is parallelized (torchtitan converts before parallelism too), with one log line that
// says what was converted.
//
// A CPU trains in float8 only with the section's emulate = true (the exact CPU reference, for
// tests and debugging); a GPU needs FP8 tensor cores (compute capability 8.9 or newer). Both are
// errors naming the device, found before the data is prepared.
#pragma once

#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/nn/float8_conversion.h"
#include "runtime/nn/module.h"
#include "train/config/job_config.h"

namespace mt::train {

// Whether the job converts anything to float8: linears (enable) or experts (fqns).
bool float8_enabled(const config::JobConfig& job);

// Fails when a float8 section is on and `device` (training.device as resolved, "auto" included)
// cannot run it; nothing when float8 is off.
void check_float8_device(const config::JobConfig& job, runtime::Device device);

// Converts `model` as job's float8 sections ask (float8_enabled must hold) and returns the log
// line, e.g. "float8: 112 linears (tensorwise), 1 left in bfloat16: output (filtered)". Experts
// fqns that match no routed experts are an error naming the key.
std::string apply_float8_training(runtime::nn::Module& model, const config::JobConfig& job,
                                  runtime::Device device);
// The same for a rank's pipeline stages, one log line for all of them (a rank's stages may hold
// no experts: not an error).
std::string apply_float8_training(const std::vector<runtime::nn::Module*>& stages,
                                  const config::JobConfig& job, runtime::Device device);

// The log text of a conversion: converted count of `noun`s and recipe, then those left in
// `high_precision` (the compute dtype) grouped by reason, a few names per reason, e.g.
// "1 linear (tensorwise)" (the log line starts it with "float8: ").
std::string float8_conversion_text(const runtime::nn::Float8Conversion& conversion,
                                   const std::string& recipe, const std::string& high_precision,
                                   const std::string& noun = "linear");

}  // namespace mt::train
