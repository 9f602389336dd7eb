// ShardedManagedCollisionCollection: the managed-collision id mapping of
// runtime/sparse/managed_collision.h, sharded by buckets across the ranks of a process group.
// Rank r of W owns buckets [nb r / W, nb (r + 1) / W) of each table (nb = the table's fixed,
// world-independent num_buckets), so a contiguous range of its rows; a rank may own none.
//
//   ShardedManagedCollisionCollection mc(tables, world);   // same configs on every rank
//   mc.set_lookup_only("user_hist");
//   McCollectionResult r = mc.remap(local_kjt, step);      // collective
//   for (auto& e : r.evicted) ebc.reset_rows(e.table, e.rows, step);  // same rows on every rank
//   KeyedTensor out = ebc(r.features);
//
// remap(local KJT, step) is collective; the result equals what the single-process
// ManagedCollisionCollection gives for the global batch (the ranks' batches together, in any
// order: a remap does not depend on the order of its ids), restricted to this rank's samples: the same rows, the same dropped ids,
// the same evicted rows (every rank gets every table's evictions, ascending). Communication, in
// this order on every rank (empty batches and ranks owning no buckets included):
//   1. "mc_counts": all_to_all_single of W x F i64 counts (F = managed features): how many ids of
//      each feature this rank sends to each owner;
//   2. "mc_ids": all_to_all_single of the raw ids, grouped by owner, then feature, in local
//      order. An owner runs one ManagedCollisionTable::remap per table over its features (table
//      order), each over the source ranks in rank order: the global batch's order restricted to
//      its buckets, so the same inserts and evictions;
//   3. "mc_rows": the rows back (the reverse exchange; -1 = dropped);
//   4. "mc_evicted_counts" (all_gather of T counts) and, when any rank evicted rows,
//      "mc_evicted" (all_gather padded to the largest count).
// Inputs are checked on each rank before any collective (every managed feature present,
// non-negative ids); a rank whose input is bad throws, the others end at the collective timeout.
//
// State (checkpoints): state() gives this rank's rows of each table's global row_ids / row_meta
// arrays (McStatePiece, global row coordinates, independent of the world size);
// load_state(pieces) accepts the pieces of any saved world size (each rank passes at least the
// pieces covering its own rows; other rows are ignored) and rebuilds its buckets. Not
// collective. train/ turns the pieces into checkpoint tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "runtime/sparse/managed_collision.h"

namespace mt::parallel {

using runtime::sparse::ManagedCollisionConfig;
using runtime::sparse::McCollectionResult;
using runtime::sparse::McStatePiece;
using runtime::sparse::McStats;

class ShardedManagedCollisionCollection {
 public:
  ShardedManagedCollisionCollection(std::vector<ManagedCollisionConfig> tables,
                                    std::shared_ptr<ProcessGroup> group);

  void set_lookup_only(const std::string& feature, bool on = true);
  bool lookup_only(const std::string& feature) const;

  // Collective (see above). `features` holds this rank's samples.
  McCollectionResult remap(const runtime::sparse::KeyedJaggedTensor& features, int64_t step);
  // The rows the ids have now, without changing anything (no inserts, no evictions, no usage
  // counts): ids without a row are dropped. Collective, as remap's steps 1-3 ("mc_peek_*"). For
  // reading a later batch's rows ahead (kv prefetch): its remap may still move some ids.
  runtime::sparse::KeyedJaggedTensor peek(const runtime::sparse::KeyedJaggedTensor& features);

  size_t num_tables() const { return tables_.size(); }
  // This rank's part of table i (its bucket range).
  const runtime::sparse::ManagedCollisionTable& local_table(size_t i) const {
    return tables_.at(i);
  }
  // The buckets rank `rank` owns of table i.
  std::pair<int64_t, int64_t> bucket_range(size_t table, int rank) const;
  ProcessGroup& group() const { return *group_; }

  // Counters of the ids this rank owned (sum over tables); global_stats() all-reduces them.
  McStats local_stats() const;
  McStats global_stats() const;  // collective ("mc_stats")

  std::vector<McStatePiece> state() const;
  void load_state(const std::vector<McStatePiece>& pieces);

 private:
  // remap's steps 1-3 with `lookup(table, ids, insert flags)` on the owners: the KJT's values
  // with managed ids replaced by their rows (-1: dropped) and keep flags.
  struct Exchanged {
    std::vector<int64_t> values;
    std::vector<uint8_t> keep;
  };
  using OwnerLookup = std::function<std::vector<int64_t>(
      size_t table, const std::vector<int64_t>& ids, const std::vector<uint8_t>& insert)>;
  Exchanged exchange(const runtime::sparse::KeyedJaggedTensor& kjt, const OwnerLookup& lookup,
                     const char* tag);

  std::shared_ptr<ProcessGroup> group_;
  std::vector<runtime::sparse::ManagedCollisionTable> tables_;  // this rank's buckets
  std::vector<std::vector<int>> bucket_owner_;                  // per table, per bucket
  std::vector<std::string> features_;                           // table by table
  std::vector<size_t> feature_table_;
  std::vector<uint8_t> feature_lookup_only_;
};

}  // namespace mt::parallel
