// Reading a config file onto a JobConfig. A file holds sections ([training] ...) and, at its top,
// optionally `extends = "base.toml"`: the base (a path relative to the including file's folder)
// is applied first, then the including file overlays it; bases may extend further, and a cycle is
// an error that names the chain. Every value set records its file and line in config.origins.
#pragma once

#include <filesystem>

#include "train/config/job_config.h"

namespace mt::train::config {

// Applies `file` (and its extends chain) onto `config`. Values are type-checked here; value
// rules and cross-key rules are checked on the final config by validate() (validate.h), so a
// base may hold a value that its extension replaces.
void apply_file(JobConfig& config, const std::filesystem::path& file);

}  // namespace mt::train::config
