// Rendering a resolved JobConfig as TOML (what --print-config prints and what every run writes
// into its dump folder): every section and every key with its value, commented with the key's
// doc and, for values not at their default, where they were set. Loading the rendered text
// again gives an equal JobConfig.
#pragma once

#include <filesystem>
#include <string>

#include "train/config/job_config.h"

namespace mt::train::config {

struct RenderOptions {
  bool docs = true;     // a "# doc" line above each key
  bool origins = true;  // "# from configs/x.toml line 3" after values that were set
};

std::string render_toml(const JobConfig& config, const RenderOptions& options = {});

// Writes render_toml(config) to `path`, creating its folder; the file is replaced atomically
// (written beside it, then renamed), so a reader never sees half a config.
void write_config(const JobConfig& config, const std::filesystem::path& path,
                  const RenderOptions& options = {});

}  // namespace mt::train::config
