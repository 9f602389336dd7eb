// Offline views of a saved checkpoint folder (no process group needed), for the mt_checkpoint
// tool and tests: a summary with every checksum verified, whole tensors, and consolidation into
// one HDF5 file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "checkpoint/index.h"
#include "runtime/core/tensor.h"

namespace mt::checkpoint {

struct TensorSummary {
  std::string fqn;
  runtime::DType dtype = runtime::DType::F32;
  runtime::Shape shape;
  int64_t bytes = 0;
  int chunks = 0;
  std::vector<std::string> files;  // the rank files holding its chunks
};

struct CheckpointSummary {
  std::filesystem::path dir;
  Index index;
  std::vector<TensorSummary> tensors;  // sorted by name
  int64_t total_bytes = 0;
  int rank_files = 0;
  std::vector<std::string> checksum_errors;  // empty when every chunk verified
  IndexChecksum index_checksum = IndexChecksum::Absent;  // a damaged index throws instead
};

// Reads the index and, with `verify`, every chunk's checksum (errors are collected, not thrown).
CheckpointSummary inspect_checkpoint(const std::filesystem::path& dir, bool verify = true);
// Human-readable: values, a table of tensors, totals, the checksum verdict.
void print_summary(const CheckpointSummary& summary, std::ostream& out);

// One whole tensor, read through the index's virtual dataset (after checking the rank files).
runtime::Tensor read_whole_tensor(const std::filesystem::path& dir, const std::string& fqn);

// Writes `out`: /tensors/<fqn> whole (each with the chunk attributes of h5_tensor.h, offset 0,
// floating tensors cast to `dtype` when given) and /state/<key> values. One tensor in memory at a
// time. Checksums are verified first; a mismatch throws and writes nothing.
void consolidate_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& out,
                            std::optional<runtime::DType> dtype = std::nullopt);

}  // namespace mt::checkpoint
