#include "train/config/load.h"

#include "runtime/core/error.h"
#include "train/config/toml_file.h"

namespace mt::train::config {

JobConfig load_config(const CommandLine& command_line) {
  JobConfig config;
  if (!command_line.config_file.empty()) apply_file(config, command_line.config_file);
  apply_overrides(config, command_line.overrides);
  validate(config);
  return config;
}

JobConfig load_config(const std::filesystem::path& file,
                      const std::vector<std::string>& override_args) {
  CommandLine command_line = parse_command_line(override_args);
  MT_CHECK(command_line.config_file.empty() && !command_line.help && !command_line.print_config &&
               !command_line.describe_model,
           "load_config: override_args take only --section.key flags");
  command_line.config_file = file.string();  // empty: no file, defaults and overrides only
  return load_config(command_line);
}

}  // namespace mt::train::config
