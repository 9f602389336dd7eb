// The command line of `train`:
//   train [--config FILE] [--section.key=VALUE | --section.key VALUE]... [--print-config] [--describe-model] [--help]
// Overrides win over the config file, which wins over defaults; a later override of the same key
// wins over an earlier one. VALUE is parsed per the key's type (value.h: true/false, integers,
// numbers, strings, lists as a,b,c or ["a", "b"]). Unknown flags (with a "did you mean"), missing
// values and values of the wrong type are errors, found before anything is loaded.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "train/config/job_config.h"
#include "train/config/value.h"

namespace mt::train::config {

struct Override {
  std::string key;   // "training.steps"
  Value value;       // already of the key's type
  std::string flag;  // as written, for messages: "--training.steps=10" or "--training.steps 10"
};

struct CommandLine {
  std::string config_file;  // empty: defaults and overrides only
  bool print_config = false;
  bool describe_model = false;  // the train binary prints size and FLOPs/token, then exits
  bool print_pipeline_schedule = false;  // ... prints the pipeline schedule grid, then exits
  bool help = false;
  std::vector<Override> overrides;
};

// `args` without the program name.
CommandLine parse_command_line(const std::vector<std::string>& args);
CommandLine parse_command_line(int argc, const char* const* argv);  // skips argv[0]

// Sets each override in order and records its flag as the value's origin.
void apply_overrides(JobConfig& config, const std::vector<Override>& overrides);

// Usage text: the flags, then every section and key with its type, default, rule and doc.
std::string help_text(std::string_view program = "train");

}  // namespace mt::train::config
