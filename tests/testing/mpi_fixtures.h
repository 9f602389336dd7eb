// Pieces the multi-rank trainer tests share: a folder every rank sees, and the small tokenizer
// trained once (by rank 0) into it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "parallel/comm/process_group.h"

namespace mt::testing {

// A temporary folder every rank of `world` shares (named after rank 0's pid, `prefix` and
// `name`), made empty by rank 0 before anyone uses it (collective).
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

}  // namespace mt::testing
