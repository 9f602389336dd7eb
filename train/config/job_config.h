// JobConfig: every section of a job config, plus where each value came from.
//
// Build one with load_config (load.h): defaults < config file (with its `extends` chain) <
// command-line overrides. Pass each component only its own section (`config.optimizer`).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "train/config/sections.h"

namespace mt::train::config {

// Where a value was set: a file and line, or a command-line flag. Default values have no origin.
struct Origin {
  std::string file;  // the path as given or as resolved from `extends`; empty for a flag
  int64_t line = 0;
  std::string flag;  // "--training.steps=10" as written; empty for a file

  // "configs/x.toml line 12" or "command-line flag --training.steps=10".
  std::string where() const;
};

struct JobConfig {
  JobSectionConfig job;
  ModelConfig model;
  OptimizerConfig optimizer;
  LRSchedulerConfig lr_scheduler;
  TrainingConfig training;
  ParallelismConfig parallelism;
  CheckpointConfig checkpoint;
  ActivationCheckpointConfig activation_checkpoint;
  Float8LinearConfig float8;  // [quantize.linear.float8]
  Float8GroupedMMConfig float8_grouped_mm;  // [quantize.grouped_mm.float8]
  MetricsConfig metrics;
  ProfilingConfig profiling;
  ValidationConfig validation;
  EmbeddingTablesConfig embedding;
  CommConfig comm;

  // Origins of the values that were set, keyed by "section.key". Not part of the value:
  // operator== ignores it.
  std::map<std::string, Origin, std::less<>> origins;

  // "configs/x.toml line 12", "command-line flag --training.steps=10", or "default value".
  std::string where(std::string_view key) const;
};

// Equal values in every key (compared through the schema, so no key is forgotten); origins are
// not compared.
bool operator==(const JobConfig& a, const JobConfig& b);

}  // namespace mt::train::config
