// The trainer's pipeline plan: from [parallelism] pipeline_parallel_* and the model's layer count,
// the stages' layer ranges and the schedule, checked before any work (a split or a schedule that
// cannot run is an error naming the numbers), and the schedule as text for
// `train --print-pipeline-schedule`.
#pragma once

#include <string>
#include <vector>

#include "models/registry.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_split.h"
#include "train/config/job_config.h"
#include "train/config/validate.h"

namespace mt::train {

struct PipelinePlan {
  parallel::pipeline::PipelineSchedule schedule;
  std::vector<parallel::pipeline::LayerSplit> stages;  // by global stage index
};

// Throws mt::Error when the model cannot be split (no build_stage) or the settings do not fit.
PipelinePlan plan_pipeline(const config::JobConfig& job, const config::WorldLayout& layout,
                           const models::ModelSpec& spec);

// The schedule grid and each stage's layers, for the pipeline degree the config asks for (the
// world size is taken as pp x the other degrees' product when data_parallel_shard_degree = -1).
std::string describe_pipeline_schedule(const config::JobConfig& job);

}  // namespace mt::train
