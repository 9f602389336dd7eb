// The sharded embedding-bag collection's row updates (see the header's "Gradient modes", "Kv
// tables" and "Update modes"): the backward sinks, the update modes, the row listener, and the kv
// tables' working sets, prefetch and statistics.
#include <algorithm>

#include "parallel/embedding/embedding_dist.h"
#include "parallel/embedding/shard_group_optimizers.h"
#include "parallel/embedding/sharded_embedding_bag_collection.h"
#include "parallel/embedding/sharded_embedding_bag_group.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"
#include "runtime/sparse/row_sparse_grad.h"

namespace mt::parallel {

using namespace sharded_ebc;
using runtime::RowSparseGrad;
using runtime::Tensor;
using runtime::sparse::GradientMode;
using runtime::sparse::KeyedJaggedTensor;
using runtime::sparse::KvWorkingSet;
using runtime::sparse::TableStorage;
using runtime::sparse::TableUpdate;

runtime::TableGradSink ShardedEmbeddingBagCollection::make_sink(int k) {
  if (!is_training()) return nullptr;
  if (k == kDP) return [this](std::vector<RowSparseGrad>& grads) { dp_sink(grads); };
  return [this, k](std::vector<RowSparseGrad>& grads) {
    runtime::NoGradGuard no_grad;
    update_rows(*groups_[size_t(k)], std::move(grads));
  };
}

// data_parallel tables: sum the replicas' gradients (one flat all-reduce: dense rows, then one
// touch count per row), then step the rows any replica touched.
void ShardedEmbeddingBagCollection::dp_sink(std::vector<RowSparseGrad>& grads) {
  Group& g = *groups_[kDP];
  runtime::NoGradGuard no_grad;
  // Lookup-indexed (every data_parallel table has all its rows here).
  update_rows(g, all_reduce_row_grads(*output_group_, g.lookup_weights(), grads, options_.dtype,
                                      "sebc.dp.grad_all_reduce"));
}

namespace {

// The rows of `weight` at `rows` as a host copy.
Tensor host_rows(const Tensor& weight, const Tensor& rows) {
  return runtime::index_select(weight, 0, rows.to(weight.device())).to(runtime::Device::cpu());
}

}  // namespace

// A group's lookup-indexed gradients of one backward: read-only aliases and frozen tables drop
// theirs, writeback tables take them as their rows' new values, the others go to the optimizer
// (Fused: stepped now; RowSparse: kept). Then the listener hears of the changed rows and the kv
// working sets go back to their caches (Fused).
void ShardedEmbeddingBagCollection::update_rows(Group& g, std::vector<RowSparseGrad> grads) {
  std::vector<RowSparseGrad> train, changed;  // changed: lookup-indexed
  for (RowSparseGrad& r : grads) {
    const size_t lt = size_t(r.table);
    if (g.alias_of[lt] >= 0 || g.update[lt] == TableUpdate::Frozen) continue;
    if (g.update[lt] == TableUpdate::Writeback) {
      const Tensor w = g.weight_of(lt);
      runtime::index_copy_(w, 0, r.rows.to(w.device()), r.values.to(w.device()));
      w.bump_version();
      changed.push_back(std::move(r));
      continue;
    }
    if (row_listener_ && options_.gradient_mode == GradientMode::Fused)
      changed.push_back({r.table, r.rows, Tensor()});
    train.push_back(std::move(r));
  }
  std::vector<RowSparseGrad> mine = g.remap(train);
  if (options_.gradient_mode == GradientMode::Fused)
    g.optimizer.step(g.opt_weights(), mine);
  else
    runtime::sparse::accumulate(g.sparse_grads, mine);
  report_rows(g, changed);
  if (options_.gradient_mode == GradientMode::Fused) commit_kv(g);
}

void ShardedEmbeddingBagCollection::report_rows(const Group& g,
                                                const std::vector<RowSparseGrad>& changed) {
  // data_parallel replicas change alike: rank 0 speaks for them.
  if (!row_listener_ || changed.empty() || (g.kind == kDP && group_->rank() != 0)) return;
  std::vector<runtime::sparse::RowUpdate> updates;
  for (const RowSparseGrad& r : changed) {
    if (r.rows.numel() == 0) continue;
    const size_t lt = size_t(r.table);
    const EmbeddingBagConfig& c = configs_[g.table_cfg[lt]];
    const runtime::sparse::TableShard& shard =
        g.kv[lt] ? g.kv[lt]->config().shard : g.module[lt]->config().shard;
    runtime::sparse::RowUpdate u;
    u.table = c.name;
    u.step = g.opt_index[lt] >= 0 ? g.optimizer.step_count(size_t(g.opt_index[lt])) : 0;
    u.embedding_dim = c.embedding_dim;
    u.col_offset = shard.col_offset;
    const Tensor rows = r.rows.to(runtime::Device::cpu());
    const std::vector<int64_t> local = rows.to_vector<int64_t>();
    for (int64_t i : local)
      u.rows.push_back(shard.row_offset + (g.kv[lt] ? g.ws[lt].rows[size_t(i)] : i));
    u.values = host_rows(g.weight_of(lt), rows);
    if (row_listener_state_ && g.opt_index[lt] >= 0) {
      if (g.kv[lt]) {
        const KvWorkingSet& ws = g.ws[lt];
        const auto& fields = g.kv[lt]->state_fields();
        const Tensor* st[] = {&ws.momentum1, &ws.momentum2};
        for (size_t f = 0; f < fields.size(); ++f)
          u.state.emplace_back(fields[f].first, host_rows(*st[f], rows));
      } else {
        for (const auto& [name, t] : g.optimizer.table_state(size_t(g.opt_index[lt])))
          u.state.emplace_back(name, host_rows(t, rows));
      }
    }
    updates.push_back(std::move(u));
  }
  if (!updates.empty()) row_listener_(std::move(updates));
}

Tensor ShardedEmbeddingBagCollection::gather_kv_rows(Group& g, const Tensor& values,
                                                     const Tensor& offsets, int64_t batch) {
  commit_kv(g);
  const std::vector<int64_t> o = offsets.to_vector<int64_t>();
  std::vector<int64_t> v = values.to_vector<int64_t>();
  const size_t F = g.layout.feature_table.size();
  for (size_t j = 0; j < g.kv.size(); ++j) {
    if (!g.kv[j]) continue;
    auto reads = [&](size_t f) { return g.primary(size_t(g.layout.feature_table[f])) == j; };
    std::vector<int64_t> rows = g.ids_read_from(j, v, o, batch);
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    g.ws[j] = g.kv[j]->gather(std::move(rows));  // on the tables' device
    const std::vector<int64_t>& ws_rows = g.ws[j].rows;
    // The ids become positions in the working set: the same order, so the lookup and the
    // optimizer see the rows exactly as an in-memory table's.
    for (size_t f = 0; f < F; ++f)
      if (reads(f))
        for (int64_t i = o[f * size_t(batch)]; i < o[(f + 1) * size_t(batch)]; ++i)
          v[size_t(i)] =
              std::lower_bound(ws_rows.begin(), ws_rows.end(), v[size_t(i)]) - ws_rows.begin();
    if (g.opt_index[j] >= 0)
      g.optimizer.bind_rows(size_t(g.opt_index[j]), int64_t(ws_rows.size()), g.ws[j].momentum1,
                            g.ws[j].momentum2);
  }
  g.ws_pending = is_training() && runtime::GradMode::enabled();
  return runtime::from_vector<int64_t>(v, {int64_t(v.size())}, i64());
}

void ShardedEmbeddingBagCollection::commit_kv(Group& g) {
  if (!g.ws_pending) return;
  MT_CHECK(g.sparse_grads.empty(), "ShardedEmbeddingBagCollection: kv tables take one forward per ",
           "optimizer step: call apply_sparse_grads() (or zero_sparse_grads()) before the next "
           "forward (no gradient accumulation over batches)");
  for (size_t j = 0; j < g.kv.size(); ++j)
    if (g.kv[j]) g.kv[j]->scatter(g.ws[j]);
  g.ws_pending = false;
}

void ShardedEmbeddingBagCollection::prefetch(const KeyedJaggedTensor& next_features) {
  // The same verdict on every rank (route is collective), whether or not this rank holds a kv
  // shard.
  if (std::none_of(configs_.begin(), configs_.end(), [](const EmbeddingBagConfig& c) {
        return c.storage == TableStorage::Kv;
      }))
    return;
  const Routed r = route(next_features);
  for (int k = 0; k < kKinds; ++k) {
    const Group& g = *groups_[size_t(k)];
    if (!g.has_kv || !r.inputs[size_t(k)].values.defined()) continue;
    const Routed::LookupInput& in = r.inputs[size_t(k)];
    const std::vector<int64_t> o = in.offsets.to_vector<int64_t>();
    const std::vector<int64_t> v = in.values.to_vector<int64_t>();
    for (size_t j = 0; j < g.kv.size(); ++j)
      if (g.kv[j]) g.kv[j]->prefetch(g.ids_read_from(j, v, o, in.batch));
  }
}

void ShardedEmbeddingBagCollection::apply_sparse_grads() {
  runtime::NoGradGuard no_grad;
  for (const auto& gp : groups_) {
    Group& g = *gp;
    std::vector<RowSparseGrad> changed;  // lookup-indexed, for the listener
    if (row_listener_)
      for (const RowSparseGrad& r : g.sparse_grads)
        changed.push_back({int64_t(g.opt_lookup.at(size_t(r.table))), r.rows, Tensor()});
    if (g.present && g.optimizer.num_tables() > 0) g.optimizer.step(g.opt_weights(), g.sparse_grads);
    g.sparse_grads.clear();
    report_rows(g, changed);
    commit_kv(g);
  }
}

void ShardedEmbeddingBagCollection::flush_kv() {
  for (const auto& g : groups_) {
    commit_kv(*g);
    for (const auto& kv : g->kv)
      if (kv) kv->flush();
  }
}

runtime::sparse::KvStats ShardedEmbeddingBagCollection::kv_stats() const {
  runtime::sparse::KvStats total;
  for (const auto& g : groups_)
    for (const auto& kv : g->kv) {
      if (kv) total += kv->stats();
    }
  return total;
}

void ShardedEmbeddingBagCollection::set_row_update_listener(
    runtime::sparse::RowUpdateListener listener, bool with_state) {
  row_listener_ = std::move(listener);
  row_listener_state_ = with_state;
}

}  // namespace mt::parallel
