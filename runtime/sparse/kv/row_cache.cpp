#include "runtime/sparse/kv/row_cache.h"

#include <algorithm>
#include <cctype>

#include "runtime/core/error.h"

namespace mt::runtime::sparse {

const char* cache_policy_name(CachePolicy policy) {
  return policy == CachePolicy::LRU ? "lru" : "lfu";
}

CachePolicy parse_cache_policy(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "lru") return CachePolicy::LRU;
  if (n == "lfu") return CachePolicy::LFU;
  MT_FAIL("row cache: unknown policy '", name, "' (expected lru or lfu)");
}

RowCache::RowCache(int64_t capacity, size_t row_bytes, CachePolicy policy, int64_t ways)
    : row_bytes_(row_bytes), policy_(policy) {
  MT_CHECK(capacity >= 1 && ways >= 1, "RowCache: capacity ", capacity, " and ways ", ways,
           " must be positive");
  ways_ = std::min(ways, capacity);
  sets_ = (capacity + ways_ - 1) / ways_;
  const size_t slots = size_t(sets_ * ways_);
  keys_.assign(slots, 0);
  used_.assign(slots, false);
  pinned_.assign(slots, false);
  last_use_.assign(slots, 0);
  uses_.assign(slots, 0);
  data_.resize(slots * row_bytes_);
}

int64_t RowCache::set_of(int64_t key) const {
  uint64_t h = uint64_t(key) * 0x9E3779B97F4A7C15ull;  // Fibonacci hashing
  h ^= h >> 29;
  return int64_t(h % uint64_t(sets_));
}

int64_t RowCache::peek(int64_t key) const {
  const int64_t base = set_of(key) * ways_;
  for (int64_t s = base; s < base + ways_; ++s)
    if (used_[size_t(s)] && keys_[size_t(s)] == key) return s;
  return -1;
}

void RowCache::touch(int64_t slot) {
  last_use_[size_t(slot)] = ++clock_;
  ++uses_[size_t(slot)];
}

int64_t RowCache::find(int64_t key) {
  const int64_t s = peek(key);
  if (s >= 0) touch(s);
  return s;
}

RowCache::Insert RowCache::insert(int64_t key) {
  const int64_t base = set_of(key) * ways_;
  Insert r;
  int64_t victim = -1;
  for (int64_t s = base; s < base + ways_; ++s) {
    if (!used_[size_t(s)]) {
      victim = s;
      break;
    }
    if (victim < 0) {
      victim = s;
      continue;
    }
    const auto older = [&](int64_t a, int64_t b) {  // a evicted before b
      if (pinned_[size_t(a)] != pinned_[size_t(b)]) return !pinned_[size_t(a)];
      if (policy_ == CachePolicy::LFU && uses_[size_t(a)] != uses_[size_t(b)])
        return uses_[size_t(a)] < uses_[size_t(b)];
      return last_use_[size_t(a)] < last_use_[size_t(b)];
    };
    if (older(s, victim)) victim = s;
  }
  if (used_[size_t(victim)]) {
    r.evicted = true;
    r.evicted_key = keys_[size_t(victim)];
  } else {
    ++size_;
  }
  r.slot = victim;
  keys_[size_t(victim)] = key;
  used_[size_t(victim)] = true;
  pinned_[size_t(victim)] = false;
  uses_[size_t(victim)] = 0;
  touch(victim);
  return r;
}

void RowCache::erase(int64_t key) {
  const int64_t s = peek(key);
  if (s < 0) return;
  used_[size_t(s)] = false;
  --size_;
}

void RowCache::unpin_all() { std::fill(pinned_.begin(), pinned_.end(), false); }

void RowCache::clear() {
  std::fill(used_.begin(), used_.end(), false);
  std::fill(pinned_.begin(), pinned_.end(), false);
  size_ = 0;
}

std::vector<std::pair<int64_t, int64_t>> RowCache::entries() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t s = 0; s < keys_.size(); ++s)
    if (used_[s]) out.emplace_back(keys_[s], int64_t(s));
  return out;
}

}  // namespace mt::runtime::sparse
