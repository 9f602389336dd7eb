// RowCache: a set-associative cache of fixed-width byte rows keyed by row id, in front of a
// kv-backed embedding table (kv_table.h): FBGEMM's SSD-table cache on the host.
//
// `capacity` rows in sets of up to `ways` slots (sets = ceil(capacity / ways), the row's set by a
// hash of its id). When a set is full, insert() evicts by the policy and hands the evicted row
// back so the caller can write it to the store:
//   LRU  the row used least recently (find and insert count as uses)
//   LFU  the row used least often (ties: least recently)
// Pinned rows (pin) are evicted only when every way of their set is pinned: a prefetch pins the
// next batch's cached rows so this step's write-back does not push them out.
// row_bytes = 0: the cache manages slots only and the caller keeps the rows (KvTable's cache in
// device memory, one tensor row per slot); row() is then unusable.
// Not thread-safe: one owner (the training thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mt::runtime::sparse {

enum class CachePolicy { LRU, LFU };
const char* cache_policy_name(CachePolicy policy);
// "lru" / "lfu" (case-insensitive); throws naming the accepted values.
CachePolicy parse_cache_policy(const std::string& name);

class RowCache {
 public:
  RowCache(int64_t capacity, size_t row_bytes, CachePolicy policy, int64_t ways = 16);

  int64_t capacity() const { return int64_t(keys_.size()); }
  size_t row_bytes() const { return row_bytes_; }
  int64_t size() const { return size_; }

  // The slot holding `key`, or -1; a hit counts as a use.
  int64_t find(int64_t key);
  // The slot holding `key`, or -1, without counting a use.
  int64_t peek(int64_t key) const;

  struct Insert {
    int64_t slot = -1;
    bool evicted = false;
    int64_t evicted_key = 0;  // valid when evicted: its bytes are still in row(slot)
  };
  // Makes room for `key` (absent: check with find first) and claims a slot for it. When a row
  // was evicted, its bytes stay in row(slot) until the caller overwrites them.
  Insert insert(int64_t key);
  // Drops `key` if present.
  void erase(int64_t key);
  void pin(int64_t slot) { pinned_[size_t(slot)] = true; }
  void unpin_all();
  void clear();

  std::byte* row(int64_t slot) { return data_.data() + size_t(slot) * row_bytes_; }
  const std::byte* row(int64_t slot) const { return data_.data() + size_t(slot) * row_bytes_; }
  // (key, slot) of every cached row, in slot order.
  std::vector<std::pair<int64_t, int64_t>> entries() const;

 private:
  int64_t set_of(int64_t key) const;
  void touch(int64_t slot);

  size_t row_bytes_;
  CachePolicy policy_;
  int64_t ways_, sets_;
  int64_t size_ = 0;
  uint64_t clock_ = 0;
  std::vector<int64_t> keys_;  // per slot
  std::vector<bool> used_;     // per slot
  std::vector<bool> pinned_;   // per slot
  std::vector<uint64_t> last_use_, uses_;
  std::vector<std::byte> data_;
};

}  // namespace mt::runtime::sparse
