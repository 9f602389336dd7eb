#include "runtime/sparse/managed_collision.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "runtime/ops/factory.h"

namespace mt::runtime::sparse {

namespace {

constexpr int64_t kFreeKey = std::numeric_limits<int64_t>::min();

Tensor i64_tensor(const int64_t* data, int64_t n) {
  Tensor t = Tensor::empty({n}, TensorOptions{}.with_dtype(DType::I64));
  std::copy(data, data + n, t.data<int64_t>());
  return t;
}

std::vector<int64_t> i64_values(const Tensor& t, const std::string& what) {
  MT_CHECK(t.defined() && t.dtype() == DType::I64 && t.dim() == 1 && t.device().is_cpu(),
           "ManagedCollisionTable: ", what, " must be a 1-D i64 CPU tensor, got ",
           t.defined() ? t.dtype() : DType::I64, " ", t.defined() ? t.shape() : Shape{});
  return t.contiguous().to_vector<int64_t>();
}

}  // namespace

const char* eviction_policy_name(EvictionPolicy policy) {
  return policy == EvictionPolicy::LRU ? "lru" : "lfu";
}

EvictionPolicy parse_eviction_policy(const std::string& name) {
  std::string s = name;
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (s == "lru") return EvictionPolicy::LRU;
  if (s == "lfu") return EvictionPolicy::LFU;
  MT_FAIL("managed collision: unknown eviction policy '", name, "' (expected 'lru' or 'lfu')");
}

uint64_t mc_hash(int64_t id, uint64_t seed) {
  // splitmix64 of the id offset by a mixed seed.
  uint64_t z = uint64_t(id) + 0x9E3779B97F4A7C15ULL * (seed + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

McStats& McStats::operator+=(const McStats& o) {
  hits += o.hits;
  inserts += o.inserts;
  evictions += o.evictions;
  misses += o.misses;
  overflow += o.overflow;
  return *this;
}

ManagedCollisionConfig resolved_mc_config(ManagedCollisionConfig c) {
  MT_CHECK(!c.name.empty(), "managed collision: a table needs a name");
  MT_CHECK(c.num_embeddings > 0, "managed collision table '", c.name,
           "': num_embeddings must be positive, got ", c.num_embeddings);
  if (c.num_buckets == 0) c.num_buckets = std::min<int64_t>(c.num_embeddings, 64);
  MT_CHECK(c.num_buckets > 0 && c.num_buckets <= c.num_embeddings, "managed collision table '",
           c.name, "': num_buckets must be in [1, num_embeddings = ", c.num_embeddings, "], got ",
           c.num_buckets);
  return c;
}

// ---- ManagedCollisionTable -----------------------------------------------------------------

ManagedCollisionTable::ManagedCollisionTable(ManagedCollisionConfig config, int64_t bucket_begin,
                                             int64_t bucket_end)
    : config_(resolved_mc_config(std::move(config))) {
  if (bucket_end < 0) bucket_end = config_.num_buckets;
  MT_CHECK(0 <= bucket_begin && bucket_begin <= bucket_end && bucket_end <= config_.num_buckets,
           "managed collision table '", config_.name, "': bucket range [", bucket_begin, ", ",
           bucket_end, ") is not inside [0, ", config_.num_buckets, ")");
  bucket_begin_ = bucket_begin;
  bucket_end_ = bucket_end;
  const int64_t n = row_end() - row_begin();
  row_id_.assign(size_t(n), -1);
  row_meta_.assign(size_t(n), 0);
  in_batch_.assign(size_t(n), 0);
  order_.resize(size_t(bucket_end_ - bucket_begin_));
  stale_.assign(order_.size(), 0);
  for (int64_t b = bucket_begin_; b < bucket_end_; ++b) rebuild_bucket(b);
}

int64_t ManagedCollisionTable::bucket_of(int64_t id) const {
  return int64_t(mc_hash(id, config_.seed) % uint64_t(config_.num_buckets));
}

int64_t ManagedCollisionTable::bucket_row_begin(int64_t bucket) const {
  return bucket * config_.num_embeddings / config_.num_buckets;
}

int64_t ManagedCollisionTable::find(int64_t id) const {
  auto it = row_of_.find(id);
  return it == row_of_.end() ? -1 : it->second;
}

std::pair<int64_t, int64_t> ManagedCollisionTable::order_key(int64_t row) const {
  const size_t s = size_t(slot(row));
  return {row_id_[s] < 0 ? kFreeKey : row_meta_[s], row};
}

void ManagedCollisionTable::rebuild_bucket(int64_t bucket) {
  auto& order = order_[size_t(bucket - bucket_begin_)];
  order.clear();
  stale_[size_t(bucket - bucket_begin_)] = 0;
  for (int64_t row = bucket_row_begin(bucket); row < bucket_row_begin(bucket + 1); ++row) {
    const int64_t id = row_id_[size_t(slot(row))];
    if (id >= 0) {
      MT_CHECK(bucket_of(id) == bucket, "managed collision table '", config_.name, "': row ", row,
               " holds id ", id, " of bucket ", bucket_of(id), ", not of the row's bucket ", bucket,
               " (state saved with another seed or num_buckets?)");
      auto it = row_of_.find(id);
      MT_CHECK(it == row_of_.end() || it->second == row || row_id_[size_t(slot(it->second))] != id,
               "managed collision table '", config_.name, "': id ", id, " is held by rows ",
               it->second, " and ", row);
      row_of_[id] = row;
    }
    order.insert(order_key(row));
  }
}

McRemapResult ManagedCollisionTable::remap(const std::vector<int64_t>& ids, bool insert,
                                           int64_t step) {
  return remap(ids, std::vector<uint8_t>(ids.size(), insert ? 1 : 0), step);
}

McRemapResult ManagedCollisionTable::remap(const std::vector<int64_t>& ids,
                                           const std::vector<uint8_t>& insert, int64_t step) {
  MT_CHECK(insert.size() == ids.size(), "managed collision table '", config_.name,
           "': ", insert.size(), " insert flags for ", ids.size(), " ids");
  const size_t n = ids.size();
  McRemapResult res;
  res.rows.assign(n, -1);
  for (size_t b = 0; b < stale_.size(); ++b)
    MT_CHECK(!stale_[b], "managed collision table '", config_.name, "': bucket ",
             bucket_begin_ + int64_t(b), " (rows [", bucket_row_begin(bucket_begin_ + int64_t(b)),
             ", ", bucket_row_begin(bucket_begin_ + int64_t(b) + 1),
             ")) was only partly loaded by load_rows; load the rest of its rows first");
  std::vector<int64_t> buckets(n);
  for (size_t i = 0; i < n; ++i) {
    MT_CHECK(ids[i] >= 0, "managed collision table '", config_.name,
             "': raw ids must be non-negative, got ", ids[i], " at position ", i);
    buckets[i] = bucket_of(ids[i]);
    MT_CHECK(buckets[i] >= bucket_begin_ && buckets[i] < bucket_end_, "managed collision table '",
             config_.name, "': id ", ids[i], " is in bucket ", buckets[i],
             ", which this table does not own (buckets [", bucket_begin_, ", ", bucket_end_, "))");
  }
  std::vector<int64_t> touched;
  const bool lru = config_.eviction == EvictionPolicy::LRU;
  // One use of `row` (of `bucket`) by this batch: out of the eviction order until the end.
  auto use = [&](int64_t row, int64_t bucket) {
    const size_t s = size_t(slot(row));
    if (!in_batch_[s]) {
      order_[size_t(bucket - bucket_begin_)].erase(order_key(row));
      in_batch_[s] = 1;
      touched.push_back(row);
    }
    if (lru)
      row_meta_[s] = step;
    else
      ++row_meta_[s];
  };
  // 1. hits
  for (size_t i = 0; i < n; ++i) {
    const int64_t row = find(ids[i]);
    if (row < 0) continue;
    res.rows[i] = row;
    use(row, buckets[i]);
    ++stats_.hits;
  }
  // 2. inserts, in ascending id order (the result does not depend on the ids' order in the batch)
  std::vector<size_t> new_ids;
  for (size_t i = 0; i < n; ++i)
    if (res.rows[i] < 0 && insert[i]) new_ids.push_back(i);
  std::stable_sort(new_ids.begin(), new_ids.end(),
                   [&](size_t a, size_t b) { return ids[a] < ids[b]; });
  for (size_t i : new_ids) {
    int64_t row = find(ids[i]);
    if (row < 0) {
      auto& order = order_[size_t(buckets[i] - bucket_begin_)];
      if (order.empty()) {  // every row of the bucket is used by this batch
        ++stats_.overflow;
        continue;
      }
      row = order.begin()->second;
      order.erase(order.begin());
      const size_t s = size_t(slot(row));
      if (row_id_[s] >= 0) {
        row_of_.erase(row_id_[s]);
        res.evicted.push_back(row);
        ++stats_.evictions;
      }
      row_id_[s] = ids[i];
      row_meta_[s] = 0;
      in_batch_[s] = 1;
      touched.push_back(row);
      row_of_[ids[i]] = row;
      ++stats_.inserts;
    }
    res.rows[i] = row;
    use(row, buckets[i]);
  }
  // 3. lookup-only occurrences of ids unknown before the call
  for (size_t i = 0; i < n; ++i) {
    if (res.rows[i] >= 0 || insert[i]) continue;
    const int64_t row = find(ids[i]);
    if (row < 0) {
      ++stats_.misses;
      continue;
    }
    res.rows[i] = row;
    use(row, buckets[i]);
  }
  for (int64_t row : touched) {
    const size_t s = size_t(slot(row));
    in_batch_[s] = 0;
    order_[size_t(bucket_of(row_id_[s]) - bucket_begin_)].insert(order_key(row));
  }
  std::sort(res.evicted.begin(), res.evicted.end());
  return res;
}

std::vector<McStatePiece> ManagedCollisionTable::state() const {
  const int64_t n = row_end() - row_begin();
  return {McStatePiece{config_.name + ".row_ids", i64_tensor(row_id_.data(), n),
                       config_.num_embeddings, row_begin()},
          McStatePiece{config_.name + ".row_meta", i64_tensor(row_meta_.data(), n),
                       config_.num_embeddings, row_begin()}};
}

void ManagedCollisionTable::load_rows(int64_t row_offset, const Tensor& row_ids,
                                      const Tensor& row_meta) {
  const std::vector<int64_t> ids = i64_values(row_ids, "row_ids of '" + config_.name + "'");
  const std::vector<int64_t> meta = i64_values(row_meta, "row_meta of '" + config_.name + "'");
  const int64_t n = int64_t(ids.size());
  MT_CHECK(int64_t(meta.size()) == n, "managed collision table '", config_.name, "': ", n,
           " row_ids but ", meta.size(), " row_meta values");
  MT_CHECK(row_offset >= 0 && row_offset + n <= config_.num_embeddings, "managed collision table '",
           config_.name, "': rows [", row_offset, ", ", row_offset + n, ") do not fit the table's ",
           config_.num_embeddings, " rows");
  const int64_t lo = std::max(row_offset, row_begin()), hi = std::min(row_offset + n, row_end());
  for (int64_t row = lo; row < hi; ++row) {
    const size_t s = size_t(slot(row));
    const int64_t id = ids[size_t(row - row_offset)], m = meta[size_t(row - row_offset)];
    MT_CHECK(id >= -1 && m >= 0, "managed collision table '", config_.name, "': row ", row,
             " has id ", id, " and meta ", m, " (expected id >= -1, meta >= 0)");
    auto it = row_id_[s] >= 0 ? row_of_.find(row_id_[s]) : row_of_.end();
    if (it != row_of_.end() && it->second == row) row_of_.erase(it);
    row_id_[s] = id;
    row_meta_[s] = id < 0 ? 0 : m;
  }
  for (int64_t b = bucket_begin_; b < bucket_end_; ++b) {
    const int64_t b0 = bucket_row_begin(b), b1 = bucket_row_begin(b + 1);
    if (b0 >= row_offset && b1 <= row_offset + n)
      rebuild_bucket(b);
    else if (b0 < row_offset + n && b1 > row_offset)
      stale_[size_t(b - bucket_begin_)] = 1;  // partly loaded
  }
}

void ManagedCollisionTable::load_state(const std::vector<McStatePiece>& pieces) {
  const std::string ids_name = config_.name + ".row_ids", meta_name = config_.name + ".row_meta";
  std::vector<std::pair<int64_t, int64_t>> covered;  // row ranges
  for (const McStatePiece& p : pieces) {
    if (p.name != ids_name) continue;
    MT_CHECK(p.global_rows == config_.num_embeddings, "managed collision table '", config_.name,
             "': saved state has ", p.global_rows, " rows, the table has ", config_.num_embeddings);
    const McStatePiece* meta = nullptr;
    for (const McStatePiece& q : pieces)
      if (q.name == meta_name && q.row_offset == p.row_offset) meta = &q;
    MT_CHECK(meta != nullptr, "managed collision table '", config_.name, "': piece '", ids_name,
             "' at row ", p.row_offset, " has no '", meta_name, "' piece at the same row");
    load_rows(p.row_offset, p.local, meta->local);
    covered.emplace_back(p.row_offset, p.row_offset + p.local.numel());
  }
  std::sort(covered.begin(), covered.end());
  int64_t next = row_begin();
  for (const auto& [lo, hi] : covered)
    if (lo <= next) next = std::max(next, hi);
  MT_CHECK(next >= row_end(), "managed collision table '", config_.name,
           "': the saved state does not cover rows [", next, ", ", row_end(),
           ") of this table's rows [", row_begin(), ", ", row_end(), ")");
  for (int64_t b = bucket_begin_; b < bucket_end_; ++b) rebuild_bucket(b);
}

// ---- KJT level -------------------------------------------------------------------------------

KeyedJaggedTensor replace_kjt_values(const KeyedJaggedTensor& kjt,
                                     const std::vector<int64_t>& new_values,
                                     const std::vector<uint8_t>& keep) {
  MT_CHECK(int64_t(new_values.size()) == kjt.num_values() && keep.size() == new_values.size(),
           "replace_kjt_values: ", new_values.size(), " new values and ", keep.size(),
           " keep flags for a KJT of ", kjt.num_values());
  const std::vector<int64_t> lengths = kjt.lengths().to_vector<int64_t>();
  const std::vector<float> weights =
      kjt.has_weights() ? kjt.weights().contiguous().to_vector<float>() : std::vector<float>{};
  std::vector<int64_t> values, out_lengths(lengths.size(), 0);
  std::vector<float> out_weights;
  values.reserve(new_values.size());
  size_t i = 0;
  for (size_t bag = 0; bag < lengths.size(); ++bag)
    for (int64_t j = 0; j < lengths[bag]; ++j, ++i) {
      if (!keep[i]) continue;
      values.push_back(new_values[i]);
      ++out_lengths[bag];
      if (kjt.has_weights()) out_weights.push_back(weights[i]);
    }
  KeyedJaggedTensor out =
      KeyedJaggedTensor::from_lengths(kjt.keys(), values, out_lengths, {}, kjt.stride());
  if (kjt.has_weights())  // (the host-vector overload treats empty weights as "unweighted")
    out = KeyedJaggedTensor::from_lengths(
        kjt.keys(), out.values(), out.lengths(),
        from_vector<float>(out_weights, {int64_t(out_weights.size())}), kjt.stride());
  return out;
}

ManagedCollisionCollection::ManagedCollisionCollection(std::vector<ManagedCollisionConfig> tables) {
  for (ManagedCollisionConfig& c : tables) {
    for (const auto& t : tables_)
      MT_CHECK(t.name() != c.name, "ManagedCollisionCollection: two tables are named '", c.name,
               "'");
    MT_CHECK(!c.feature_names.empty(), "ManagedCollisionCollection: table '", c.name,
             "' has no feature_names");
    for (const std::string& f : c.feature_names) {
      MT_CHECK(std::find(features_.begin(), features_.end(), f) == features_.end(),
               "ManagedCollisionCollection: feature '", f,
               "' is listed by more than one table (or twice)");
      features_.push_back(f);
      feature_table_.push_back(tables_.size());
      feature_lookup_only_.push_back(0);
    }
    tables_.emplace_back(std::move(c));
  }
}

void ManagedCollisionCollection::set_lookup_only(const std::string& feature, bool on) {
  auto it = std::find(features_.begin(), features_.end(), feature);
  MT_CHECK(it != features_.end(), "ManagedCollisionCollection: no table reads feature '", feature,
           "'");
  feature_lookup_only_[size_t(it - features_.begin())] = on ? 1 : 0;
}

bool ManagedCollisionCollection::lookup_only(const std::string& feature) const {
  auto it = std::find(features_.begin(), features_.end(), feature);
  MT_CHECK(it != features_.end(), "ManagedCollisionCollection: no table reads feature '", feature,
           "'");
  return feature_lookup_only_[size_t(it - features_.begin())] != 0;
}

ManagedCollisionTable& ManagedCollisionCollection::table(const std::string& name) {
  for (auto& t : tables_)
    if (t.name() == name) return t;
  MT_FAIL("ManagedCollisionCollection: no table named '", name, "'");
}

McCollectionResult ManagedCollisionCollection::remap(const KeyedJaggedTensor& kjt, int64_t step) {
  kjt.validate();
  const std::vector<int64_t> values = kjt.values().to_vector<int64_t>();
  const std::vector<int64_t> offs = kjt.offset_per_key();
  std::vector<int64_t> out = values;
  std::vector<uint8_t> keep(values.size(), 1);
  McCollectionResult result;
  for (size_t t = 0; t < tables_.size(); ++t) {
    std::vector<int64_t> ids, pos;
    std::vector<uint8_t> insert;
    for (size_t f = 0; f < features_.size(); ++f) {
      if (feature_table_[f] != t) continue;
      const int64_t k = kjt.key_index(features_[f]);
      for (int64_t i = offs[size_t(k)]; i < offs[size_t(k) + 1]; ++i) {
        ids.push_back(values[size_t(i)]);
        pos.push_back(i);
        insert.push_back(feature_lookup_only_[f] ? 0 : 1);
      }
    }
    McRemapResult r = tables_[t].remap(ids, insert, step);
    for (size_t i = 0; i < pos.size(); ++i) {
      out[size_t(pos[i])] = r.rows[i];
      keep[size_t(pos[i])] = r.rows[i] >= 0;
    }
    result.evicted.push_back({tables_[t].name(), std::move(r.evicted)});
  }
  result.features = replace_kjt_values(kjt, out, keep);
  return result;
}

McStats ManagedCollisionCollection::stats() const {
  McStats s;
  for (const auto& t : tables_) s += t.stats();
  return s;
}

std::vector<McStatePiece> ManagedCollisionCollection::state() const {
  std::vector<McStatePiece> out;
  for (const auto& t : tables_)
    for (McStatePiece& p : t.state()) out.push_back(std::move(p));
  return out;
}

void ManagedCollisionCollection::load_state(const std::vector<McStatePiece>& pieces) {
  for (auto& t : tables_) t.load_state(pieces);
}

}  // namespace mt::runtime::sparse
