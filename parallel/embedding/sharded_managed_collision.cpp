#include "parallel/embedding/sharded_managed_collision.h"

#include <algorithm>

namespace mt::parallel {

using runtime::DType;
using runtime::TensorOptions;
using runtime::sparse::KeyedJaggedTensor;
using runtime::sparse::ManagedCollisionTable;
using runtime::sparse::McRemapResult;

namespace {

Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, TensorOptions{}.with_dtype(DType::I64));
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

Tensor i64_empty(int64_t n) { return Tensor::empty({n}, TensorOptions{}.with_dtype(DType::I64)); }

int64_t sum(const std::vector<int64_t>& v, size_t begin, size_t end) {
  int64_t s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s;
}

}  // namespace

ShardedManagedCollisionCollection::ShardedManagedCollisionCollection(
    std::vector<ManagedCollisionConfig> tables, std::shared_ptr<ProcessGroup> group)
    : group_(std::move(group)) {
  MT_CHECK(group_ != nullptr, "ShardedManagedCollisionCollection: no process group");
  const int W = group_->size(), me = group_->rank();
  for (ManagedCollisionConfig& raw : tables) {
    ManagedCollisionConfig c = runtime::sparse::resolved_mc_config(std::move(raw));
    for (const auto& t : tables_)
      MT_CHECK(t.name() != c.name, "ShardedManagedCollisionCollection: two tables are named '",
               c.name, "'");
    MT_CHECK(!c.feature_names.empty(), "ShardedManagedCollisionCollection: table '", c.name,
             "' has no feature_names");
    for (const std::string& f : c.feature_names) {
      MT_CHECK(std::find(features_.begin(), features_.end(), f) == features_.end(),
               "ShardedManagedCollisionCollection: feature '", f,
               "' is listed by more than one table (or twice)");
      features_.push_back(f);
      feature_table_.push_back(tables_.size());
      feature_lookup_only_.push_back(0);
    }
    std::vector<int> owner(size_t(c.num_buckets));
    for (int r = 0; r < W; ++r)
      for (int64_t b = c.num_buckets * r / W; b < c.num_buckets * (r + 1) / W; ++b)
        owner[size_t(b)] = r;
    bucket_owner_.push_back(std::move(owner));
    const int64_t nb = c.num_buckets;
    tables_.emplace_back(std::move(c), nb * me / W, nb * (me + 1) / W);
  }
}

std::pair<int64_t, int64_t> ShardedManagedCollisionCollection::bucket_range(size_t table,
                                                                            int rank) const {
  const int64_t nb = tables_.at(table).num_buckets(), W = group_->size();
  return {nb * rank / W, nb * (rank + 1) / W};
}

void ShardedManagedCollisionCollection::set_lookup_only(const std::string& feature, bool on) {
  auto it = std::find(features_.begin(), features_.end(), feature);
  MT_CHECK(it != features_.end(), "ShardedManagedCollisionCollection: no table reads feature '",
           feature, "'");
  feature_lookup_only_[size_t(it - features_.begin())] = on ? 1 : 0;
}

bool ShardedManagedCollisionCollection::lookup_only(const std::string& feature) const {
  auto it = std::find(features_.begin(), features_.end(), feature);
  MT_CHECK(it != features_.end(), "ShardedManagedCollisionCollection: no table reads feature '",
           feature, "'");
  return feature_lookup_only_[size_t(it - features_.begin())] != 0;
}

ShardedManagedCollisionCollection::Exchanged ShardedManagedCollisionCollection::exchange(
    const KeyedJaggedTensor& kjt, const OwnerLookup& lookup, const char* tag) {
  const int W = group_->size();
  const size_t F = features_.size(), T = tables_.size(), nw = size_t(W);
  const std::string prefix(tag);
  // ---- local checks, before any collective
  kjt.validate();
  const std::vector<int64_t> values = kjt.values().to_vector<int64_t>();
  const std::vector<int64_t> offs = kjt.offset_per_key();
  std::vector<int64_t> key_of(F);
  for (size_t f = 0; f < F; ++f) {
    key_of[f] = kjt.key_index(features_[f]);
    for (int64_t i = offs[size_t(key_of[f])]; i < offs[size_t(key_of[f]) + 1]; ++i)
      MT_CHECK(values[size_t(i)] >= 0, "ShardedManagedCollisionCollection: feature '", features_[f],
               "' has a negative raw id ", values[size_t(i)], " (rank ", group_->rank(), ")");
  }

  // ---- 1. counts per (owner, feature); ids grouped by owner, then feature
  std::vector<int64_t> send_counts(nw * F, 0);
  std::vector<std::vector<int64_t>> owner_of(F);
  for (size_t f = 0; f < F; ++f) {
    const ManagedCollisionTable& t = tables_[feature_table_[f]];
    const std::vector<int>& owners = bucket_owner_[feature_table_[f]];
    for (int64_t i = offs[size_t(key_of[f])]; i < offs[size_t(key_of[f]) + 1]; ++i) {
      const int o = owners[size_t(t.bucket_of(values[size_t(i)]))];
      owner_of[f].push_back(o);
      ++send_counts[size_t(o) * F + f];
    }
  }
  std::vector<int64_t> cursor(nw * F, 0);  // write position of each (owner, feature) segment
  {
    int64_t pos = 0;
    for (size_t i = 0; i < nw * F; ++i) {
      cursor[i] = pos;
      pos += send_counts[i];
    }
  }
  std::vector<int64_t> send_ids(size_t(sum(send_counts, 0, send_counts.size())));
  std::vector<int64_t> send_pos(values.size(), -1);  // value index -> send position
  for (size_t f = 0; f < F; ++f) {
    const int64_t k0 = offs[size_t(key_of[f])];
    for (size_t j = 0; j < owner_of[f].size(); ++j) {
      const int64_t p = cursor[size_t(owner_of[f][j]) * F + f]++;
      send_ids[size_t(p)] = values[size_t(k0) + j];
      send_pos[size_t(k0) + j] = p;
    }
  }
  const Tensor recv_counts_t = i64_empty(int64_t(nw * F));
  group_->all_to_all_single(recv_counts_t, i64_tensor(send_counts), {}, {},
                            prefix + "_counts");
  const std::vector<int64_t> recv_counts = recv_counts_t.to_vector<int64_t>();

  // ---- 2. ids to their owners
  std::vector<int64_t> in_splits(nw), out_splits(nw);
  for (size_t r = 0; r < nw; ++r) {
    in_splits[r] = sum(send_counts, r * F, (r + 1) * F);
    out_splits[r] = sum(recv_counts, r * F, (r + 1) * F);
  }
  const int64_t n_recv = sum(out_splits, 0, nw);
  const Tensor recv_ids_t = i64_empty(n_recv);
  group_->all_to_all_single(recv_ids_t, i64_tensor(send_ids), out_splits, in_splits,
                            prefix + "_ids");
  const std::vector<int64_t> recv_ids = recv_ids_t.to_vector<int64_t>();
  std::vector<int64_t> recv_start(nw * F, 0);  // start of each (source, feature) segment
  {
    int64_t pos = 0;
    for (size_t i = 0; i < nw * F; ++i) {
      recv_start[i] = pos;
      pos += recv_counts[i];
    }
  }

  // ---- the owner looks them up, table by table: features in order, sources in rank order
  std::vector<int64_t> reply(size_t(n_recv), -1);
  for (size_t t = 0; t < T; ++t) {
    std::vector<int64_t> ids, pos;
    std::vector<uint8_t> insert;
    for (size_t f = 0; f < F; ++f) {
      if (feature_table_[f] != t) continue;
      for (size_t s = 0; s < nw; ++s)
        for (int64_t i = 0; i < recv_counts[s * F + f]; ++i) {
          const int64_t p = recv_start[s * F + f] + i;
          ids.push_back(recv_ids[size_t(p)]);
          pos.push_back(p);
          insert.push_back(feature_lookup_only_[f] ? 0 : 1);
        }
    }
    const std::vector<int64_t> rows = lookup(t, ids, insert);
    for (size_t i = 0; i < pos.size(); ++i) reply[size_t(pos[i])] = rows[i];
  }

  // ---- 3. rows back
  const Tensor rows_t = i64_empty(int64_t(send_ids.size()));
  group_->all_to_all_single(rows_t, i64_tensor(reply), in_splits, out_splits,
                            prefix + "_rows");
  const std::vector<int64_t> rows = rows_t.to_vector<int64_t>();
  Exchanged out;
  out.values = values;
  out.keep.assign(values.size(), 1);
  for (size_t i = 0; i < values.size(); ++i) {
    if (send_pos[i] < 0) continue;  // a key no table manages
    out.values[i] = rows[size_t(send_pos[i])];
    out.keep[i] = out.values[i] >= 0;
  }
  return out;
}

KeyedJaggedTensor ShardedManagedCollisionCollection::peek(const KeyedJaggedTensor& kjt) {
  const Exchanged e = exchange(
      kjt,
      [this](size_t t, const std::vector<int64_t>& ids, const std::vector<uint8_t>&) {
        std::vector<int64_t> rows;
        rows.reserve(ids.size());
        for (int64_t id : ids) rows.push_back(tables_[t].find(id));
        return rows;
      },
      "mc_peek");
  return runtime::sparse::replace_kjt_values(kjt, e.values, e.keep);
}

McCollectionResult ShardedManagedCollisionCollection::remap(const KeyedJaggedTensor& kjt,
                                                            int64_t step) {
  const size_t T = tables_.size(), nw = size_t(group_->size());
  std::vector<std::vector<int64_t>> evicted(T);
  const Exchanged e = exchange(
      kjt,
      [&](size_t t, const std::vector<int64_t>& ids, const std::vector<uint8_t>& insert) {
        McRemapResult r = tables_[t].remap(ids, insert, step);
        evicted[t] = std::move(r.evicted);
        return std::move(r.rows);
      },
      "mc");

  // ---- 4. evicted rows to every rank
  std::vector<int64_t> my_counts(T);
  for (size_t t = 0; t < T; ++t) my_counts[t] = int64_t(evicted[t].size());
  const Tensor all_counts_t = i64_empty(int64_t(nw * T));
  group_->all_gather_into(all_counts_t, i64_tensor(my_counts), "mc_evicted_counts");
  const std::vector<int64_t> all_counts = all_counts_t.to_vector<int64_t>();
  int64_t longest = 0;
  for (size_t r = 0; r < nw; ++r) longest = std::max(longest, sum(all_counts, r * T, (r + 1) * T));
  McCollectionResult result;
  for (size_t t = 0; t < T; ++t) result.evicted.push_back({tables_[t].name(), {}});
  if (longest > 0) {
    std::vector<int64_t> mine(size_t(longest), -1);
    size_t p = 0;
    for (size_t t = 0; t < T; ++t)
      for (int64_t row : evicted[t]) mine[p++] = row;
    const Tensor all_t = i64_empty(int64_t(nw) * longest);
    group_->all_gather_into(all_t, i64_tensor(mine), "mc_evicted");
    const std::vector<int64_t> all = all_t.to_vector<int64_t>();
    // Ranks own ascending row ranges, so rank order keeps each table's rows ascending.
    for (size_t r = 0; r < nw; ++r) {
      size_t q = r * size_t(longest);
      for (size_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < all_counts[r * T + t]; ++i)
          result.evicted[t].rows.push_back(all[q++]);
    }
  }
  result.features = runtime::sparse::replace_kjt_values(kjt, e.values, e.keep);
  return result;
}

McStats ShardedManagedCollisionCollection::local_stats() const {
  McStats s;
  for (const auto& t : tables_) s += t.stats();
  return s;
}

McStats ShardedManagedCollisionCollection::global_stats() const {
  const McStats s = local_stats();
  const Tensor v = i64_tensor({s.hits, s.inserts, s.evictions, s.misses, s.overflow});
  group_->all_reduce(v, ReduceOp::Sum, "mc_stats");
  const std::vector<int64_t> g = v.to_vector<int64_t>();
  return McStats{g[0], g[1], g[2], g[3], g[4]};
}

std::vector<McStatePiece> ShardedManagedCollisionCollection::state() const {
  std::vector<McStatePiece> out;
  for (const auto& t : tables_)
    for (McStatePiece& p : t.state()) out.push_back(std::move(p));
  return out;
}

void ShardedManagedCollisionCollection::load_state(const std::vector<McStatePiece>& pieces) {
  for (auto& t : tables_) t.load_state(pieces);
}

}  // namespace mt::parallel
