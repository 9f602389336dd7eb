// Damaged checkpoint files are refused before HDF5 parses them: a flipped byte in index.h5 (its
// checksum file, index.h) or in a rank file (its seal in the index for the HDF5 metadata,
// rank_file_seal.h, and the chunk checksums for the data) is an error naming the file from
// read_index, inspect and load. Flips in index.h5's global heap and in rank files' headers used
// to crash inside HDF5. Indexes without a checksum file (older checkpoints) still read.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/consolidate.h"
#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/index.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"
#include "tests/testing/scratch_dir.h"

namespace mt::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

std::shared_ptr<parallel::ProcessGroup> world() {
  static std::shared_ptr<parallel::ProcessGroup> w(parallel::MpiProcessGroup::world());
  return w;
}

CheckpointState small_state() {
  CheckpointState s;
  s.tensors = {whole("model.w", runtime::full({16, 8}, 1.5)),
               whole("model.b", runtime::full({8}, -2.0))};
  s.values["step"] = int64_t(7);
  s.values["tokens_seen"] = int64_t(7 * 4096);
  s.values["config"] = std::string("[training]\nsteps = 10\n");
  s.per_rank_group = "dataloader";
  s.per_rank_values["position"] = int64_t(123456);
  return s;
}

std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(),
                                                             std::streamsize(bytes.size()));
}

// What inspect finds wrong: its error, or its first chunk checksum error ("" when nothing).
std::string inspect_problem(const fs::path& dir) {
  try {
    const CheckpointSummary s = inspect_checkpoint(dir);
    return s.checksum_errors.empty() ? "" : s.checksum_errors.front();
  } catch (const Error& e) {
    return e.what();
  }
}

// Every way a checkpoint is read, each a clean mt::Error naming the damaged index.
void expect_refused_everywhere(const fs::path& dir, const std::string& what) {
  const std::string index = (dir / kIndexFileName).string();
  for (const std::string& e :
       {error_of([&] { read_index(dir / kIndexFileName); }),
        error_of([&] { inspect_checkpoint(dir); }),
        error_of([&] {
          CheckpointState dest = small_state();
          load_checkpoint(dir, dest, *world());
        })}) {
    EXPECT_NE(e.find("checkpoint index " + index + " is damaged"), std::string::npos)
        << what << ": " << e;
  }
}

TEST(IndexIntegrity, EveryFlippedByteIsRefusedBeforeHdf5ReadsIt) {
  testing::ScratchDir scratch;
  const fs::path dir = scratch / "step-7";
  save_checkpoint(dir, small_state(), *world());
  ASSERT_TRUE(fs::exists(index_checksum_path(dir / kIndexFileName)));
  EXPECT_EQ(inspect_checkpoint(dir).index_checksum, IndexChecksum::Verified);

  const std::vector<char> good = read_bytes(dir / kIndexFileName);
  std::mt19937 rng(2026);  // seeded: the same 150 offsets every run, plus the reported one
  std::vector<size_t> offsets = {std::min<size_t>(30878, good.size() - 1), 0, good.size() - 1};
  while (offsets.size() < 150) offsets.push_back(rng() % good.size());
  for (size_t offset : offsets) {
    std::vector<char> bad = good;
    bad[offset] = char(bad[offset] ^ (1 << (rng() % 8)));
    write_bytes(dir / kIndexFileName, bad);
    expect_refused_everywhere(dir, "byte " + std::to_string(offset));
    if (::testing::Test::HasFailure()) break;  // one offset's messages are enough
  }
  write_bytes(dir / kIndexFileName, good);
  EXPECT_EQ(std::get<int64_t>(read_index(dir / kIndexFileName).values.at("step")), 7);
}

TEST(IndexIntegrity, ATruncatedIndexOrDamagedChecksumFileIsRefused) {
  testing::ScratchDir scratch;
  const fs::path dir = scratch / "step-7";
  save_checkpoint(dir, small_state(), *world());
  std::vector<char> bytes = read_bytes(dir / kIndexFileName);
  bytes.resize(bytes.size() / 2);
  write_bytes(dir / kIndexFileName, bytes);
  expect_refused_everywhere(dir, "truncated");

  save_checkpoint(scratch / "step-8", small_state(), *world());
  std::ofstream(index_checksum_path(scratch / "step-8" / kIndexFileName)) << "not hex\n";
  EXPECT_NE(error_of([&] { read_index(scratch / "step-8" / kIndexFileName); })
                .find("is damaged (expected 16 hex digits)"),
            std::string::npos);
}

// 150 seeded flips in a rank file, half of them in its first 4 KiB (superblock, object headers):
// each is refused, by the seal (metadata) or by a chunk checksum (data), before anything loads.
TEST(RankFileIntegrity, EveryFlippedByteIsRefused) {
  testing::ScratchDir scratch;
  const fs::path dir = scratch / "step-7";
  save_checkpoint(dir, small_state(), *world());
  const fs::path rank_file = dir / "rank-00000.h5";
  const std::vector<char> good = read_bytes(rank_file);
  ASSERT_EQ(read_index(dir / kIndexFileName).files.size(), 1u);
  std::mt19937 rng(27);
  for (int i = 0; i < 150; ++i) {
    const size_t offset = i % 2 == 0 ? rng() % std::min<size_t>(4096, good.size())
                                     : rng() % good.size();
    std::vector<char> bad = good;
    bad[offset] = char(bad[offset] ^ (1 << (rng() % 8)));
    write_bytes(rank_file, bad);
    const std::string what = "byte " + std::to_string(offset);
    for (const std::string& e :
         {inspect_problem(dir),
          error_of([&] {
            CheckpointState dest = small_state();
            load_checkpoint(dir, dest, *world());
          })}) {
      EXPECT_TRUE(e.find("is damaged") != std::string::npos ||
                  e.find("checksum") != std::string::npos)
          << what << ": " << e;
    }
    if (::testing::Test::HasFailure()) break;
  }
  write_bytes(rank_file, good);
  CheckpointState dest = small_state();
  dest.tensors[0].local.fill_(0.0);
  load_checkpoint(dir, dest, *world());
  EXPECT_EQ(dest.tensors[0].local.to_vector<float>()[0], 1.5f);
}

// Checkpoints written before the checksum file existed still load; inspect says they are
// unverified.
TEST(IndexIntegrity, AnIndexWithoutChecksumFileStillLoads) {
  testing::ScratchDir scratch;
  const fs::path dir = scratch / "step-7";
  save_checkpoint(dir, small_state(), *world());
  fs::remove(index_checksum_path(dir / kIndexFileName));
  const CheckpointSummary s = inspect_checkpoint(dir);
  EXPECT_EQ(s.index_checksum, IndexChecksum::Absent);
  std::ostringstream printed;
  print_summary(s, printed);
  EXPECT_NE(printed.str().find("index: no checksum file"), std::string::npos) << printed.str();
  CheckpointState dest = small_state();
  dest.tensors[0].local.fill_(0.0);
  load_checkpoint(dir, dest, *world());
  EXPECT_EQ(dest.tensors[0].local.to_vector<float>()[0], 1.5f);
}

}  // namespace
}  // namespace mt::checkpoint
