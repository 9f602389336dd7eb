// Saving and loading a CheckpointState as a checkpoint folder, collectively over a process group.
//
// Save (save_checkpoint): the ranks all-gather what they hold and plan who writes what
// (save_plan.h); each rank writes its chunks into its own file, <dir>.tmp/rank-NNNNN.h5; rank 0
// then writes index.h5 and its checksum index.h5.xxh64 (index.h), every file is fsynced, and rank 0 renames <dir>.tmp to <dir>
// and fsyncs the parent folder. A folder named step-N (no .tmp) is therefore always complete: a
// crash at any point leaves at most a .tmp folder, which readers ignore. A failure on any rank
// (disk full, ...) throws on every rank with that rank's message.
//
// Load (load_checkpoint): every rank reads the index, checks the tensors it wants against it
// (missing, unexpected, shape and dtype mismatches: errors in strict mode, a report otherwise;
// unexpected = wanted by no rank of the group, as pipeline stages each want their own tensors),
// has the ranks verify every saved chunk's checksum (each chunk by one rank; a mismatch names the
// file and tensor and loads nothing), then reads for each wanted piece exactly its region
// through the index's virtual dataset: HDF5 reads only the overlapping parts (hyperslabs) of the
// saved chunks, so any saved layout loads into any other.
//
// Fault injection for tests: MT_CHECKPOINT_CRASH_AT=<point> ends the process (exit code 86) at
// that point of a save: "mid_rank_file" (after a rank's first chunk), "after_rank_files",
// "before_rename" (rank 0, index written).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/state.h"

namespace mt::parallel {
class ProcessGroup;
}

namespace mt::checkpoint {

void save_checkpoint(const std::filesystem::path& dir, const CheckpointState& state,
                     parallel::ProcessGroup& group);

struct LoadOptions {
  bool strict = true;                 // missing / unexpected tensors and mismatches are errors
  std::vector<std::string> exclude;   // tensor name prefixes neither loaded nor reported
  bool convert_dtypes = false;        // read a saved dtype into another floating dtype
};

// Whether `fqn` starts with one of `prefixes` (LoadOptions::exclude).
bool is_excluded(const std::string& fqn, const std::vector<std::string>& prefixes);

struct LoadReport {
  Values values;                           // the job-wide values
  std::vector<Values> per_rank_values;     // the saved ranks' per-rank values, by saved rank
  std::vector<std::string> missing;        // wanted, not in the checkpoint (non-strict)
  std::vector<std::string> unexpected;     // in the checkpoint, wanted by no rank (non-strict)
};

// Fills the `local` tensor of every piece of `dest` (shapes and offsets say which region).
LoadReport load_checkpoint(const std::filesystem::path& dir, CheckpointState& dest,
                           parallel::ProcessGroup& group, const LoadOptions& options = {});

}  // namespace mt::checkpoint
