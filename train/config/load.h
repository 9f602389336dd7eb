// Loading a job config: defaults < config file (with its `extends` chain) < command-line
// overrides, then validate(). This is what the train binary calls:
//
//   CommandLine cl = parse_command_line(argc, argv);
//   if (cl.help) { std::cout << help_text(); return 0; }
//   JobConfig config = load_config(cl);
//   if (cl.print_config) { std::cout << render_toml(config); return 0; }
//   WorldLayout layout = validate_for_world(config, world_size);
//   write_config(config, fs::path(config.job.dump_folder) / "config.toml");
//
// Errors are mt::Error with a message for the user (file, line, key, expected/found, "did you
// mean"). Namespace: everything of the config system is in mt::train::config.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "train/config/command_line.h"
#include "train/config/job_config.h"
#include "train/config/render.h"
#include "train/config/validate.h"

namespace mt::train::config {

JobConfig load_config(const CommandLine& command_line);

// A file (empty: none) plus override arguments ("--training.steps=10", ...): for tests and
// tools that have no argv.
JobConfig load_config(const std::filesystem::path& file,
                      const std::vector<std::string>& override_args = {});

}  // namespace mt::train::config
