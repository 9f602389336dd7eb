// Rank file seals (see rank_file_seal.h).
#include "checkpoint/rank_file_seal.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "checkpoint/checksum.h"
#include "runtime/core/error.h"

namespace mt::checkpoint {

namespace fs = std::filesystem;

namespace {

// XXH64 of the bytes of `path` (of `size` bytes) outside the sorted extents `skip`.
uint64_t hash_outside(const fs::path& path, int64_t size, const std::vector<FileExtent>& skip) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(bool(in), "checkpoint rank file ", path.string(), ": cannot be opened");
  Xxh64 hash;
  std::vector<char> buffer(size_t(1) << 16);
  auto hash_range = [&](int64_t begin, int64_t end) {
    in.seekg(begin);
    while (begin < end) {
      const auto n = std::streamsize(std::min<int64_t>(end - begin, int64_t(buffer.size())));
      in.read(buffer.data(), n);
      MT_CHECK(in.gcount() == n, "checkpoint rank file ", path.string(), ": read error");
      hash.update(buffer.data(), size_t(n));
      begin += n;
    }
  };
  int64_t at = 0;
  for (const FileExtent& e : skip) {
    hash_range(at, std::min(e.offset, size));
    at = std::max(at, e.offset + e.size);
  }
  hash_range(at, size);
  return hash.digest();
}

}  // namespace

RankFileSeal seal_rank_file(const fs::path& path, std::vector<FileExtent> data) {
  std::sort(data.begin(), data.end(),
            [](const FileExtent& a, const FileExtent& b) { return a.offset < b.offset; });
  RankFileSeal seal;
  seal.file = path.filename().string();
  seal.size = int64_t(fs::file_size(path));
  for (size_t i = 0; i < data.size(); ++i) {
    MT_CHECK(data[i].offset >= 0 && data[i].size >= 0 &&
                 data[i].offset + data[i].size <= seal.size &&
                 (i == 0 || data[i - 1].offset + data[i - 1].size <= data[i].offset),
             "checkpoint rank file ", path.string(), ": dataset extents out of the file or "
             "overlapping (offset ", data[i].offset, ", ", data[i].size, " bytes)");
  }
  seal.data = std::move(data);
  seal.metadata_xxh64 = hash_outside(path, seal.size, seal.data);
  return seal;
}

void verify_rank_file(const fs::path& dir, const RankFileSeal& seal) {
  const fs::path path = dir / seal.file;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  MT_CHECK(!ec, "checkpoint ", dir.string(), ": rank file ", seal.file, " is missing");
  MT_CHECK(int64_t(size) == seal.size, "checkpoint rank file ", path.string(), " is damaged: ",
           size, " bytes, the index says ", seal.size, "; nothing was read from it");
  MT_CHECK(hash_outside(path, seal.size, seal.data) == seal.metadata_xxh64,
           "checkpoint rank file ", path.string(),
           " is damaged: its HDF5 metadata (headers, attributes) does not match the index's "
           "checksum; nothing was read from it");
}

std::string encode_seal(const RankFileSeal& seal) {
  std::ostringstream os;
  os << seal.file << ' ' << seal.size << ' ' << seal.metadata_xxh64 << ' ' << seal.data.size();
  for (const FileExtent& e : seal.data) os << ' ' << e.offset << ' ' << e.size;
  return os.str();
}

RankFileSeal decode_seal(const std::string& text) {
  std::istringstream is(text);
  RankFileSeal seal;
  size_t n = 0;
  is >> seal.file >> seal.size >> seal.metadata_xxh64 >> n;
  seal.data.resize(n);
  for (FileExtent& e : seal.data) is >> e.offset >> e.size;
  MT_CHECK(bool(is), "checkpoint: a malformed rank file seal: ", text);
  return seal;
}

}  // namespace mt::checkpoint
