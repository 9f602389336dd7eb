// Internal to the sharded embedding-bag collection (sharded_embedding_bag_collection.cpp and
// sharded_embedding_bag_updates.cpp): the sharding groups' state (Group) and a batch after the
// input dist (Routed). Not for other users.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/embedding/sharded_embedding_bag_collection.h"
#include "runtime/core/error.h"
#include "runtime/ops/embedding_bag.h"

namespace mt::parallel {

namespace sharded_ebc {

// The sharding groups, in the order their lookups and exchanges run.
enum Kind { kDP = 0, kTW = 1, kRW = 2, kTWRW = 3, kKinds = 4 };

inline runtime::TensorOptions i64() {
  return runtime::TensorOptions{}.with_dtype(runtime::DType::I64);
}

}  // namespace sharded_ebc

// One sharding group on this rank: the tables its lookup reads (this rank's shards), the
// lookup's features, the optimizer over the non-empty shards and the kept gradients.
struct ShardedEmbeddingBagCollection::Group {
  sharded_ebc::Kind kind = sharded_ebc::kDP;
  bool present = false;  // the plan has tables of this kind (the same on every rank)
  // Lookup tables (one per table of the group that this rank reads, plus a read-only alias per
  // table with update_features that other features also read).
  std::vector<size_t> table_cfg;                        // config index
  std::vector<std::shared_ptr<runtime::sparse::EmbeddingTable>> module;  // null for an empty row block or kv
  std::vector<std::shared_ptr<runtime::sparse::KvTable>> kv;            // a kv-backed shard, else null
  std::vector<runtime::Tensor> placeholder;                      // [0, cols] for empty row blocks
  std::vector<int> alias_of;                            // the lookup table an alias reads, or -1
  std::vector<runtime::sparse::TableUpdate> update;                     // per lookup table
  std::vector<int> opt_index;                           // lookup table -> optimizer table (-1)
  std::vector<size_t> opt_lookup;                       // optimizer table -> lookup table
  runtime::TableBatchLayout layout;
  runtime::sparse::FusedEmbeddingOptimizer optimizer;
  std::vector<runtime::RowSparseGrad> sparse_grads;  // table = optimizer index
  // Kv: each kv table's working set for the current batch (kv_table.h), and whether a training
  // step still has to put them back into their caches.
  std::vector<runtime::sparse::KvWorkingSet> ws;
  bool ws_pending = false;
  bool has_kv = false;

  size_t primary(size_t lt) const { return alias_of[lt] >= 0 ? size_t(alias_of[lt]) : lt; }
  // The tensor lookup table lt reads (a kv table's working set).
  runtime::Tensor weight_of(size_t lt) const {
    const size_t p = primary(lt);
    return kv[p] ? ws[p].weight : module[p] ? module[p]->weight : placeholder[p];
  }
  // The ids the group's features read from lookup table j (aliases included), from a batch's
  // values `v` and offsets `o` of `batch` samples per feature.
  std::vector<int64_t> ids_read_from(size_t j, const std::vector<int64_t>& v,
                                     const std::vector<int64_t>& o, int64_t batch) const {
    std::vector<int64_t> ids;
    for (size_t f = 0; f < layout.feature_table.size(); ++f)
      if (primary(size_t(layout.feature_table[f])) == j)
        ids.insert(ids.end(), v.begin() + o[f * size_t(batch)],
                   v.begin() + o[(f + 1) * size_t(batch)]);
    return ids;
  }
  std::vector<runtime::Tensor> lookup_weights() const {
    std::vector<runtime::Tensor> w;
    for (size_t i = 0; i < module.size(); ++i) w.push_back(weight_of(i));
    return w;
  }
  std::vector<runtime::Tensor> opt_weights() const {
    std::vector<runtime::Tensor> w;
    for (size_t i : opt_lookup) w.push_back(weight_of(i));
    return w;
  }
  // Lookup-indexed gradients -> optimizer-indexed ones.
  std::vector<runtime::RowSparseGrad> remap(std::vector<runtime::RowSparseGrad>& grads) const {
    std::vector<runtime::RowSparseGrad> out;
    for (runtime::RowSparseGrad& g : grads) {
      const int o = opt_index.at(size_t(g.table));
      MT_CHECK(o >= 0, "sharded embedding bags: a gradient reached an empty shard");
      g.table = o;
      out.push_back(std::move(g));
    }
    return out;
  }
};

// What route() gives forward and prefetch.
struct ShardedEmbeddingBagCollection::Routed {
  struct LookupInput {
    runtime::Tensor values, offsets, weights;
    int64_t batch = 0;
  };
  runtime::sparse::KeyedJaggedTensor kjt;  // this rank's input, arranged in feature order
  runtime::Tensor offsets;        // kjt's offsets, contiguous on the host
  std::vector<int64_t> Bs, Boff;
  int64_t B = 0, G = 0;
  std::vector<LookupInput> inputs;  // per group kind (present groups with features)
};

}  // namespace mt::parallel
