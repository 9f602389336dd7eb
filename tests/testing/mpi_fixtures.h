// Pieces the multi-rank trainer tests share: a folder every rank sees, and the small tokenizer
// trained once (by rank 0) into it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "parallel/comm/process_group.h"
#include "train/train_result.h"

namespace mt::testing {

// The launch's ranks (MpiProcessGroup::world()), made once per process.
std::shared_ptr<parallel::ProcessGroup> mpi_world();

// A temporary folder every rank of `world` (all the launch's ranks) shares:
// <tmp>/<prefix>_<rank 0's pid>/<name>, made empty by rank 0 once every rank has called this and
// before anyone uses it (collective). The <prefix>_<pid> folders are removed after the last test.
std::filesystem::path shared_dir(parallel::ProcessGroup& world, const std::string& prefix,
                                 const std::string& name);

// save_small_tokenizer (trainer_fixtures.h) run by rank 0 into shared_dir(world, prefix,
// "tokenizer") (collective); the folder.
std::filesystem::path shared_small_tokenizer(parallel::ProcessGroup& world,
                                             const std::string& prefix,
                                             const std::filesystem::path& corpus);

// Runs `f` and turns an exception into a test failure naming `rank`, so that this rank still
// reaches the collective that follows (a sub-group's error must not leave the other ranks
// waiting).
void guarded(int64_t rank, const std::function<void()>& f);

// Runs `resume` (a run that loads the checkpoint `straight` saved at step `saved_step`) on a
// sub-group of the first `ranks` ranks of `world` (the others only wait), and expects it to
// continue `straight`: its steps saved_step + 1, ... with the same losses and gradient norms to
// 2e-5 (the float reduction order of another layout). Collective over `world`.
void expect_resumes_on(
    parallel::ProcessGroup& world, int ranks, const train::TrainResult& straight,
    int64_t saved_step,
    const std::function<train::TrainResult(std::shared_ptr<parallel::ProcessGroup>)>& resume);

}  // namespace mt::testing
