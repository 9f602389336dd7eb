// Checksums of tensor bytes in checkpoints: XXH64 (xxHash, 64-bit, seed 0), written here.
//
// Why XXH64: it runs at memory speed on one core (~10+ GB/s scalar, several times zlib's crc32),
// so hashing a shard costs far less than writing it to disk, and it is a published, stable
// algorithm that any tool can recompute (Python: `xxhash.xxh64(dataset_bytes).intdigest()`; the
// reference C library: XXH64(data, len, 0)). The hash covers a dataset's raw bytes in row-major
// order as stored (little-endian), which are exactly a contiguous CPU tensor's bytes.
//
// Xxh64 hashes a stream fed in pieces of any size (the result does not depend on how the bytes
// are split), so large datasets are hashed while they are read slice by slice.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace mt::checkpoint {

// The name stored in the `checksum_algorithm` attribute next to `checksum`.
inline constexpr const char* kChecksumAlgorithm = "xxh64";

class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(const void* data, size_t size);
  uint64_t digest() const;  // of everything fed so far; update() may continue afterwards

 private:
  uint64_t seed_;
  uint64_t total_ = 0;
  std::array<uint64_t, 4> acc_;
  std::array<unsigned char, 32> buffer_{};
  size_t buffered_ = 0;
};

// One-shot XXH64 of `size` bytes.
uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);

}  // namespace mt::checkpoint
