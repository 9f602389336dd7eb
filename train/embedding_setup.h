// The [embedding] settings that shape DLRM's tables beyond the row optimizer: where each table's
// rows live (memory or a kv store), how each is updated (train or frozen), the kv stores' folder
// and cache, and the per-step kv metrics the trainer logs.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "models/dlrm/model_args.h"
#include "runtime/sparse/kv/kv_table.h"
#include "train/config/job_config.h"

namespace mt::train {

// Sets args.features[*].storage / update and args.kv from config.embedding; errors name the key
// and the value that does not fit (an unknown feature, a bad "<feature>:<mode>" entry).
void apply_table_settings(const config::JobConfig& config, models::dlrm::ModelArgs& args);

// True when any table of `args` is kv-backed.
bool has_kv_tables(const models::dlrm::ModelArgs& args);

// The log line's kv metrics over the steps between two stats snapshots: kv_hit (share of the
// working-set rows found in the cache or a prefetch), kv_read_rows (rows read from the store per
// step in the training thread), kv_prefetch_rows (per step, read ahead), kv_write_rows (per step).
std::vector<std::pair<std::string, double>> kv_step_metrics(const runtime::sparse::KvStats& now,
                                                            const runtime::sparse::KvStats& before,
                                                            int64_t steps);

}  // namespace mt::train
