// Every rank of a job trains from one config. A rank given other values (a per-node config file,
// an override on one rank's command line) would train with them silently, or wait for collectives
// its peers never issue; so the ranks compare their resolved configs before any other collective.
// Only job.dump_folder and embedding.kv_path may differ: they may name node-local storage.
#pragma once

#include "train/config/job_config.h"

namespace mt::parallel {
class ProcessGroup;
}

namespace mt::train {

// Collective over `world`: every rank's resolved config against rank 0's; on a difference every
// rank throws the same mt::Error, naming the first key that differs, its values and the ranks.
void check_same_config_on_every_rank(const config::JobConfig& config,
                                     parallel::ProcessGroup& world);

}  // namespace mt::train
