// XXH64 as specified in xxHash's doc/xxhash_spec.md (version 0.1.1), byte order little-endian.
#include "checkpoint/checksum.h"

#include <algorithm>
#include <cstring>

namespace mt::checkpoint {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Little-endian loads (the hosts we build for are little-endian; memcpy keeps them aligned-safe).
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint64_t round(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  return rotl(acc, 31) * kP1;
}

inline uint64_t merge_round(uint64_t acc, uint64_t value) {
  acc ^= round(0, value);
  return acc * kP1 + kP4;
}

// Consumes whole 32-byte stripes from p; returns the number of bytes consumed.
size_t consume_stripes(std::array<uint64_t, 4>& acc, const unsigned char* p, size_t size) {
  const size_t stripes = size / 32;
  uint64_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
  for (size_t s = 0; s < stripes; ++s, p += 32) {
    a0 = round(a0, load64(p));
    a1 = round(a1, load64(p + 8));
    a2 = round(a2, load64(p + 16));
    a3 = round(a3, load64(p + 24));
  }
  acc = {a0, a1, a2, a3};
  return stripes * 32;
}

}  // namespace

Xxh64::Xxh64(uint64_t seed) : seed_(seed), acc_{seed + kP1 + kP2, seed + kP2, seed, seed - kP1} {}

void Xxh64::update(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (buffered_ > 0) {  // top up the partial stripe first
    const size_t take = std::min(size, buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, take);
    buffered_ += take;
    p += take;
    size -= take;
    if (buffered_ < buffer_.size()) return;
    consume_stripes(acc_, buffer_.data(), buffer_.size());
    buffered_ = 0;
  }
  const size_t used = consume_stripes(acc_, p, size);
  buffered_ = size - used;
  if (buffered_ > 0) std::memcpy(buffer_.data(), p + used, buffered_);
}

uint64_t Xxh64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(acc_[0], 1) + rotl(acc_[1], 7) + rotl(acc_[2], 12) + rotl(acc_[3], 18);
    for (uint64_t a : acc_) h = merge_round(h, a);
  } else {
    h = seed_ + kP5;
  }
  h += total_;
  const unsigned char* p = buffer_.data();
  size_t n = buffered_;
  for (; n >= 8; n -= 8, p += 8) h = rotl(h ^ round(0, load64(p)), 27) * kP1 + kP4;
  if (n >= 4) {
    h = rotl(h ^ (uint64_t(load32(p)) * kP1), 23) * kP2 + kP3;
    n -= 4;
    p += 4;
  }
  for (; n > 0; --n, ++p) h = rotl(h ^ (uint64_t(*p) * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t xxh64(const void* data, size_t size, uint64_t seed) {
  Xxh64 hash(seed);
  hash.update(data, size);
  return hash.digest();
}

}  // namespace mt::checkpoint
