// Counter-based random numbers (Philox4x32-10), keyed by (seed, stream name).
//
// Element i of a tensor drawn from RandomKey{seed, "layers.0.attention.wq.weight"} depends only on
// the key, the draw's `offset` and i (its row-major index in the full tensor), never on thread
// count, machine or how the tensor is split: a rank can draw just its shard (fill_*_slice) and
// get exactly the values the full tensor would hold there. Values are computed in f64, then
// rounded to the tensor's dtype.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace mt::runtime {

struct RandomKey {
  uint64_t seed = 0;
  uint64_t stream = 0;  // hash of the stream name
  uint64_t offset = 0;  // distinguishes successive draws on one stream (e.g. dropout calls)

  RandomKey() = default;
  RandomKey(uint64_t seed, std::string_view stream_name, uint64_t offset = 0);
  RandomKey with_offset(uint64_t o) const { RandomKey k = *this; k.offset = o; return k; }
};

uint64_t hash_stream_name(std::string_view name);  // FNV-1a 64, stable across machines

// The Philox4x32-10 bijection (Salmon et al., SC'11; Random123's philox4x32_10).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);
// Philox4x32-10 of counter (index, offset) under a key derived from (seed, stream).
std::array<uint32_t, 4> philox(const RandomKey& key, uint64_t index);
double uniform_at(const RandomKey& key, uint64_t index);  // in [0, 1), 53 random bits
double normal_at(const RandomKey& key, uint64_t index);   // standard normal (Box-Muller)

}  // namespace mt::runtime
