// A rank file's seal: its size and the XXH64 of every byte outside its datasets' raw data (the
// superblock, object headers, attributes, heaps and trees: what HDF5 parses to open the file and
// its datasets), hashed in file order with the data extents skipped. The raw data is covered by
// each chunk's own checksum (h5_tensor.h), so seal and chunk checksums together cover the whole
// file, while checking the seal reads only its few KiB of metadata. Load and inspect check it
// before HDF5 opens the file: a flipped byte in a rank file's headers used to crash inside HDF5
// (4 of 120 random flips in the first 8 KiB segfaulted `mt_checkpoint inspect`).
//
// The index keeps every rank file's seal (index.h). Checkpoints written before seals existed have
// none and are opened unchecked.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace mt::checkpoint {

struct FileExtent {
  int64_t offset = 0;
  int64_t size = 0;
};

struct RankFileSeal {
  std::string file;                // name, relative to the checkpoint folder
  int64_t size = 0;                // bytes
  uint64_t metadata_xxh64 = 0;     // of the bytes outside `data`
  std::vector<FileExtent> data;    // the datasets' raw data, sorted, not overlapping
};

// Seals the closed file at `path` whose datasets' raw data lie in `data` (any order).
RankFileSeal seal_rank_file(const std::filesystem::path& path, std::vector<FileExtent> data);
// Throws mt::Error naming the file when its size or metadata checksum is not the seal's.
void verify_rank_file(const std::filesystem::path& dir, const RankFileSeal& seal);

// One line of text for a collective (all_gather_strings) and back.
std::string encode_seal(const RankFileSeal& seal);
RankFileSeal decode_seal(const std::string& text);

}  // namespace mt::checkpoint
