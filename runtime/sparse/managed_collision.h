// Managed-collision ids (TorchRec's ZCH / MCH, "zero-collision hashing"): raw 64-bit ids that grow
// without bound (user ids, item ids) are mapped to the rows of a table of `num_embeddings` rows.
// An id keeps its row once assigned; a new id takes a free row; when no row is free the least
// recently used (LRU) or least frequently used (LFU) id is evicted, and the caller resets the
// evicted rows of the embedding table (EmbeddingBagCollection::reset_rows).
//
// Buckets. Rows are split into `num_buckets` fixed buckets (independent of the world size):
//   bucket(id) = mc_hash(id, seed) % num_buckets,  bucket b owns rows [b N / nb, (b + 1) N / nb)
// (integer division). A new id only takes a row of its own bucket and only evicts ids of its own
// bucket. The sharded version (parallel/embedding/sharded_managed_collision.h) gives every rank a
// contiguous range of buckets, so of rows, and gets exactly the single-process mapping.
//
// One remap call is one batch (one `step`), processed in three phases so that the result depends
// only on the multiset of the ids in each bucket, not on their order (so the sharded version and
// one process agree however the global batch is split over the ranks):
//   1. hits: every occurrence of an id that already has a row maps to it;
//   2. inserts: new ids of inserting occurrences, deduplicated, in ascending id order, take
//      the lowest free row of their bucket, else evict the bucket's LRU id (smallest last-used
//      step) or LFU id (smallest count); ties go to the lower row. Ids used in THIS batch (hits
//      and ids inserted earlier in it) are never evicted by it: when every row of the bucket is
//      used by the batch, the new id is dropped (stats().overflow counts its occurrences);
//   3. lookup-only occurrences (insert = false) of ids unknown before the call take the row an
//      inserting occurrence gave the id in phase 2, if any (counted neither as hits nor as
//      misses); otherwise they are dropped (misses).
// Dropped occurrences map to row -1; the KJT level removes them from their bags (lengths shrink,
// weights follow). Every occurrence that maps to a row "uses" it: LRU sets its last-used step to
// `step`, LFU adds one to its count (a new id starts with its occurrences in the batch).
// Evicted rows are returned sorted ascending, each once; the caller resets them. Raw ids must be
// non-negative (-1 marks a free row in the state); a negative id is refused with a message.
//
// State for checkpoints, in GLOBAL rows and independent of the world size: per table two i64
// arrays of num_embeddings elements: row_ids (the raw id a row holds, -1 when free) and row_meta
// (LRU: last step used; LFU: use count; 0 for free rows). A table object may own a bucket range
// only (the sharded case); state() gives its rows, load_rows() takes any row range: the rows
// inside the owned range are copied, and every owned bucket lying fully inside the given range
// is rebuilt (its id -> row map and eviction order), checking that each id belongs to the bucket
// (a different seed or num_buckets is refused with a message) and appears once. An owned bucket
// the range covers only partly stays unusable (remap refuses, naming it) until the rest of its
// rows is loaded; load_state(pieces) loads every piece, checks that the owned rows are covered
// and rebuilds every owned bucket.
//
// ManagedCollisionCollection is the KJT-level module: tables by name, features -> table, a
// lookup-only switch per feature. Its remap(kjt, step) returns the KJT with rows instead of raw
// ids (same keys and stride; keys no table manages pass through unchanged) and the evicted rows
// of every table. Per table the batch is its features in the table's feature_names order, each
// sample by sample, all in one remap call (the ranks' batches together are the global batch the
// sharded version reproduces).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/sparse/keyed_jagged_tensor.h"

namespace mt::runtime::sparse {

enum class EvictionPolicy { LRU, LFU };
const char* eviction_policy_name(EvictionPolicy policy);
// "lru" / "lfu" (case-insensitive); throws naming the accepted values.
EvictionPolicy parse_eviction_policy(const std::string& name);

struct ManagedCollisionConfig {
  std::string name;            // the embedding table it feeds
  int64_t num_embeddings = 0;  // rows ("zch size")
  EvictionPolicy eviction = EvictionPolicy::LRU;
  int64_t num_buckets = 0;                 // 0: min(num_embeddings, 64); at most num_embeddings
  uint64_t seed = 0;                       // of the bucket hash
  std::vector<std::string> feature_names;  // KJT level only
};

// The bucket hash (splitmix64 of the id mixed with the seed): stable across machines.
uint64_t mc_hash(int64_t id, uint64_t seed);

// Counters since construction (or reset_stats). Occurrences, except inserts/evictions (ids).
struct McStats {
  int64_t hits = 0;       // occurrences whose id had a row before the call
  int64_t inserts = 0;    // new ids given a row
  int64_t evictions = 0;  // ids evicted (rows to reset)
  int64_t misses = 0;     // lookup-only occurrences of unknown ids (dropped)
  int64_t overflow = 0;   // inserting occurrences dropped: their bucket was full of this batch
  McStats& operator+=(const McStats& o);
};

// A piece of a table's saved state: rows [row_offset, row_offset + local.size(0)) of a global
// i64 array of global_rows elements. Names: "<table>.row_ids" and "<table>.row_meta".
struct McStatePiece {
  std::string name;
  Tensor local;
  int64_t global_rows = 0;
  int64_t row_offset = 0;
};

struct McRemapResult {
  std::vector<int64_t> rows;     // one per id: the row, or -1 when dropped
  std::vector<int64_t> evicted;  // rows whose id was evicted, ascending
};

class ManagedCollisionTable {
 public:
  // Owns buckets [bucket_begin, bucket_end) (-1: to the last one), i.e. rows
  // [row_begin(), row_end()); ids of other buckets given to remap are refused.
  explicit ManagedCollisionTable(ManagedCollisionConfig config, int64_t bucket_begin = 0,
                                 int64_t bucket_end = -1);

  const ManagedCollisionConfig& config() const { return config_; }
  const std::string& name() const { return config_.name; }
  int64_t num_embeddings() const { return config_.num_embeddings; }
  int64_t num_buckets() const { return config_.num_buckets; }
  int64_t bucket_of(int64_t id) const;
  int64_t bucket_row_begin(int64_t bucket) const;  // b N / nb
  int64_t bucket_begin() const { return bucket_begin_; }
  int64_t bucket_end() const { return bucket_end_; }
  int64_t row_begin() const { return bucket_row_begin(bucket_begin_); }
  int64_t row_end() const { return bucket_row_begin(bucket_end_); }

  // One batch (see the header comment). insert: one flag for all ids, or one per id.
  McRemapResult remap(const std::vector<int64_t>& ids, bool insert, int64_t step);
  McRemapResult remap(const std::vector<int64_t>& ids, const std::vector<uint8_t>& insert,
                      int64_t step);

  // The row of `id`, or -1 (no side effects).
  int64_t find(int64_t id) const;
  int64_t num_assigned() const { return int64_t(row_of_.size()); }

  const McStats& stats() const { return stats_; }
  void reset_stats() { stats_ = McStats{}; }

  // This table's rows [row_begin(), row_end()) of the global row_ids / row_meta arrays.
  std::vector<McStatePiece> state() const;
  // Rows [row_offset, row_offset + n) of the global arrays (i64 [n] each; see above).
  void load_rows(int64_t row_offset, const Tensor& row_ids, const Tensor& row_meta);
  // load_rows from pieces named "<name>.row_ids" / "<name>.row_meta" (any saved world size),
  // then checks that every owned row was covered. Pieces of other tables are ignored.
  void load_state(const std::vector<McStatePiece>& pieces);

 private:
  int64_t slot(int64_t row) const { return row - row_begin(); }
  void rebuild_bucket(int64_t bucket);
  // Eviction order key of an occupied row; free rows sort first.
  std::pair<int64_t, int64_t> order_key(int64_t row) const;

  ManagedCollisionConfig config_;
  int64_t bucket_begin_ = 0, bucket_end_ = 0;
  std::vector<int64_t> row_id_, row_meta_;  // owned rows
  std::unordered_map<int64_t, int64_t> row_of_;
  // Per owned bucket: its rows not used by the running batch as (key, row), in eviction order
  // (free rows first, then by meta, then by row).
  std::vector<std::set<std::pair<int64_t, int64_t>>> order_;
  std::vector<uint8_t> in_batch_;  // per owned row, only during remap
  std::vector<uint8_t> stale_;     // per owned bucket: partly loaded by load_rows
  McStats stats_;
};

struct McTableEvictions {
  std::string table;
  std::vector<int64_t> rows;  // ascending
};

struct McCollectionResult {
  KeyedJaggedTensor features;             // rows instead of ids
  std::vector<McTableEvictions> evicted;  // one per table, config order
};

// The KJT with values replaced by new_values (aligned with kjt.values()); entries whose keep
// flag is 0 are dropped from their bags (lengths shrink, weights follow). Shared by the sharded
// collection.
KeyedJaggedTensor replace_kjt_values(const KeyedJaggedTensor& kjt,
                                     const std::vector<int64_t>& new_values,
                                     const std::vector<uint8_t>& keep);

class ManagedCollisionCollection {
 public:
  explicit ManagedCollisionCollection(std::vector<ManagedCollisionConfig> tables);

  // lookup_only features read rows but never insert ids (unknown ids are dropped).
  void set_lookup_only(const std::string& feature, bool on = true);
  bool lookup_only(const std::string& feature) const;

  // The input must hold every feature of every table (any key order, extra keys pass through).
  McCollectionResult remap(const KeyedJaggedTensor& features, int64_t step);

  size_t num_tables() const { return tables_.size(); }
  ManagedCollisionTable& table(size_t i) { return tables_.at(i); }
  const ManagedCollisionTable& table(size_t i) const { return tables_.at(i); }
  ManagedCollisionTable& table(const std::string& name);
  // Sum over tables.
  McStats stats() const;

  // Every table's state pieces / load from pieces of any saved world size.
  std::vector<McStatePiece> state() const;
  void load_state(const std::vector<McStatePiece>& pieces);

 private:
  std::vector<ManagedCollisionTable> tables_;
  std::vector<std::string> features_;  // table by table, feature_names order
  std::vector<size_t> feature_table_;
  std::vector<uint8_t> feature_lookup_only_;
};

// Validated copy of a config: num_buckets resolved, names and sizes checked.
ManagedCollisionConfig resolved_mc_config(ManagedCollisionConfig config);

}  // namespace mt::runtime::sparse
