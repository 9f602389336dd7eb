#include "runtime/core/rng.h"

#include <cmath>

namespace mt::runtime {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * b;
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}
constexpr double kTwoPi = 6.283185307179586476925286766559;
}  // namespace

uint64_t hash_stream_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

RandomKey::RandomKey(uint64_t seed_, std::string_view stream_name, uint64_t offset_)
    : seed(seed_), stream(hash_stream_name(stream_name)), offset(offset_) {}

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c[0], hi0, lo0);
    mulhilo(0xCD9E8D57u, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  return c;
}

std::array<uint32_t, 4> philox(const RandomKey& key, uint64_t index) {
  const uint64_t k = splitmix64(key.seed ^ splitmix64(key.stream));
  return philox4x32_10({uint32_t(index), uint32_t(index >> 32), uint32_t(key.offset),
                        uint32_t(key.offset >> 32)},
                       {uint32_t(k), uint32_t(k >> 32)});
}

static double to_unit(uint32_t hi, uint32_t lo) {  // 53 bits -> [0, 1)
  const uint64_t bits = ((uint64_t(hi) << 32) | lo) >> 11;
  return double(bits) * (1.0 / 9007199254740992.0);
}

double uniform_at(const RandomKey& key, uint64_t index) {
  const auto r = philox(key, index);
  return to_unit(r[0], r[1]);
}

double normal_at(const RandomKey& key, uint64_t index) {
  const auto r = philox(key, index);
  const double u1 = 1.0 - to_unit(r[0], r[1]);  // (0, 1]: log is finite
  const double u2 = to_unit(r[2], r[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

}  // namespace mt::runtime
