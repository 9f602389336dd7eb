// The index file of a checkpoint (`index.h5`, written by rank 0 next to the rank files):
//
//   attributes of /   format = "minititan-checkpoint", format_version = [1]
//   /chunks/          the chunk table, one row per saved chunk, as parallel datasets:
//                     fqn, dtype, file, dataset (strings [n]); ndim (int64 [n]);
//                     global_shape, offset, sizes (int64 [n, max ndim], zero-padded)
//   /tensors/<fqn>    one HDF5 virtual dataset per tensor over its chunks in the rank files, so
//                     h5py and h5dump read every tensor whole (and loading reads any region)
//   /state/<key>      the non-tensor values: scalar int64, float64 or string datasets
//   /files/           every rank file's seal (rank_file_seal.h): name, size, metadata_xxh64
//                     ([n]); its data extents as extent_count [n], extent_offset, extent_size [m]
//
// Everything is plain HDF5: no pickles, no opaque blobs.
#pragma once

#include <hdf5.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/rank_file_seal.h"
#include "checkpoint/save_plan.h"
#include "checkpoint/state.h"

namespace mt::checkpoint {

inline constexpr const char* kIndexFileName = "index.h5";
inline constexpr int64_t kFormatVersion = 1;

struct IndexChunk {
  ChunkMeta meta;
  std::string file;     // rank file name, relative to the checkpoint folder
  std::string dataset;  // path in that file
};

struct Index {
  std::vector<IndexChunk> chunks;  // sorted by fqn, then offset
  Values values;
  std::vector<RankFileSeal> files;  // every rank file's seal; empty in older checkpoints
  bool checksum_verified = false;   // read_index checked index.h5.xxh64 (false: there is none)
};

// Checks every rank file against its seal (rank_file_seal.h) before HDF5 opens any; a rank file
// the chunks name that is missing is an error too. `dir` is the checkpoint folder.
void verify_rank_files(const std::filesystem::path& dir, const Index& index);

// Writes the index, then its checksum file (below).
void write_index(const std::filesystem::path& path, const Index& index);
// Verifies the checksum file first; errors name the file and what is missing or malformed (e.g.
// a newer format version).
Index read_index(const std::filesystem::path& path);

// The checksum file beside the index, `index.h5.xxh64`: "<XXH64 of index.h5's bytes, 16 hex
// digits>  index.h5" (xxhsum's format: `xxhsum -H1 -c index.h5.xxh64` checks it too). It is
// checked before HDF5 reads a byte of the index, so a damaged index (chunk table, /state values:
// step, data positions, ...) is an error naming the file, never a crash inside HDF5 nor a resume
// at another step or data position. Indexes written before it existed have none and are read
// unchecked (index_checksum_state says so).
inline constexpr const char* kIndexChecksumSuffix = ".xxh64";
std::filesystem::path index_checksum_path(const std::filesystem::path& index_path);
enum class IndexChecksum { Verified, Absent };
// Throws mt::Error naming the index and both sums when they differ (or the file is unreadable).
IndexChecksum verify_index_checksum(const std::filesystem::path& index_path);

// Writes `values` as /state/<key> scalar datasets of `file` (the caller holds h5::Lock).
void write_values(hid_t file, const Values& values, const std::string& where);

// The virtual dataset path of a tensor in the index file.
std::string tensor_view_path(const std::string& fqn);

}  // namespace mt::checkpoint
