// The sharded unpooled collection: exchange plan, input dist, lookups, output dist and its
// backward (see the header for the protocol).
#include "parallel/embedding/sharded_embedding_collection.h"

#include <algorithm>
#include <cmath>

#include "parallel/embedding/embedding_dist.h"
#include "parallel/embedding/shard_group_optimizers.h"
#include "parallel/expert/token_exchange.h"
#include "runtime/autograd/function.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/embedding_bag.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"
#include "runtime/ops/join.h"
#include "runtime/sparse/row_sparse_grad.h"

namespace mt::parallel {

using runtime::DType;
using runtime::RowSparseGrad;
using runtime::Tensor;
using runtime::TensorOptions;
using runtime::sparse::EmbeddingCollectionOutput;
using runtime::sparse::EmbeddingConfig;
using runtime::sparse::EmbeddingTable;
using runtime::sparse::GradientMode;
using runtime::sparse::KeyedJaggedTensor;

namespace {

enum Kind { kDP = 0, kSharded = 1, kKinds = 2 };

TensorOptions i64() { return TensorOptions{}.with_dtype(DType::I64); }

Tensor i64_tensor(const std::vector<int64_t>& v) {
  return runtime::from_vector<int64_t>(v, {int64_t(v.size())}, i64());
}

}  // namespace

// One group on this rank: its tables (this rank's non-empty shards), lookup layout, optimizer and
// kept gradients. Lookup table i is optimizer table i.
struct ShardedEmbeddingCollection::Group {
  bool present = false;           // the plan has tables of this group (the same on every rank)
  std::vector<size_t> table_cfg;  // config index per lookup table
  std::vector<std::shared_ptr<EmbeddingTable>> module;
  runtime::TableBatchLayout layout;  // data_parallel only (the sharded layout is per batch)
  runtime::sparse::FusedEmbeddingOptimizer optimizer;
  std::vector<RowSparseGrad> sparse_grads;

  std::vector<Tensor> weights() const {
    std::vector<Tensor> w;
    for (const auto& m : module) w.push_back(m->weight);
    return w;
  }
  int lookup_of(size_t table) const {
    for (size_t i = 0; i < table_cfg.size(); ++i)
      if (table_cfg[i] == table) return int(i);
    return -1;
  }
};

// What every rank derives from the sharding plan.
struct ShardedEmbeddingCollection::Plan {
  // One (feature, shard) pair: the feature's ids in rows [lo, hi) go to the shard's rank, made
  // local (id - lo), which returns columns [col, col + cols) of their rows.
  struct Pair {
    size_t feature;
    int64_t lo, hi, col, cols;
  };
  int world = 1, rank = 0;
  std::vector<size_t> feature_table;    // [F]
  std::vector<std::vector<Pair>> send;  // [owner rank], the same on every rank
  std::vector<int> recv_lookup;         // [send[rank].size()]: lookup table of each pair
  std::vector<int64_t> dp_features;     // features of data_parallel tables
};

ShardedEmbeddingCollection::ShardedEmbeddingCollection(std::vector<EmbeddingConfig> tables,
                                                       ShardingPlan plan,
                                                       std::shared_ptr<ProcessGroup> group,
                                                       runtime::sparse::CollectionOptions options)
    : Module("ShardedEmbeddingCollection"),
      configs_(std::move(tables)),
      plan_(std::move(plan)),
      group_(std::move(group)),
      options_(options) {
  MT_CHECK(group_ != nullptr, "ShardedEmbeddingCollection: no process group");
  MT_CHECK(options_.gradient_mode != GradientMode::Dense,
           "ShardedEmbeddingCollection: GradientMode::Dense is not supported (shards are "
           "stepped by their row optimizers); use Fused or RowSparse");
  MT_CHECK(!options_.is_weighted,
           "ShardedEmbeddingCollection: per-value weights are not supported (unpooled lookups)");
  for (const EmbeddingConfig& c : configs_)
    MT_CHECK(c.storage == runtime::sparse::TableStorage::Memory,
             "ShardedEmbeddingCollection: table '", c.name, "' is kv-backed; unpooled "
             "collections hold memory tables only (kv tables: ShardedEmbeddingBagCollection)");
  MT_CHECK(options_.dtype == DType::F32 || options_.dtype == DType::F64,
           "ShardedEmbeddingCollection: tables must be f32 or f64, got ",
           runtime::dtype_name(options_.dtype));
  MT_CHECK(plan_.world_size == group_->size(), "ShardedEmbeddingCollection: the plan is for ",
           plan_.world_size, " ranks but the group ", group_->name(), " has ", group_->size());
  for (const EmbeddingConfig& t : configs_)
    MT_CHECK(t.shard.row_offset == 0 && t.shard.col_offset == 0 &&
                 (t.shard.num_rows < 0 || t.shard.num_rows == t.num_embeddings) &&
                 (t.shard.num_cols < 0 || t.shard.num_cols == t.embedding_dim),
             "ShardedEmbeddingCollection: table '", t.name,
             "' must be given whole (the plan says where its shards go), not as a shard");
  MT_CHECK(options_.device.is_cpu(), "ShardedEmbeddingCollection: tables on ", options_.device,
           " are not supported yet (only the pooled ShardedEmbeddingBagCollection trains on a "
           "GPU); use the CPU");
  plan_.validate(configs_);
  build();
  anchor_ = runtime::zeros({0}, TensorOptions{}.with_dtype(options_.dtype));
  anchor_.set_requires_grad(true);
}

ShardedEmbeddingCollection::~ShardedEmbeddingCollection() = default;

void ShardedEmbeddingCollection::build() {
  auto x = std::make_unique<Plan>();
  Plan& P = *x;
  P.world = group_->size();
  P.rank = group_->rank();
  const int W = P.world, me = P.rank;
  P.send.resize(size_t(W));

  // Features table by table, as the unsharded collection.
  std::vector<std::vector<size_t>> table_features(configs_.size());
  for (size_t t = 0; t < configs_.size(); ++t)
    for (const std::string& f : configs_[t].feature_names) {
      MT_CHECK(std::find(feature_names_.begin(), feature_names_.end(), f) == feature_names_.end(),
               "ShardedEmbeddingCollection: feature '", f, "' is listed by more than one table");
      table_features[t].push_back(feature_names_.size());
      feature_names_.push_back(f);
      feature_dims_.push_back(configs_[t].embedding_dim);
      P.feature_table.push_back(t);
    }

  groups_.clear();
  for (int k = 0; k < kKinds; ++k) groups_.push_back(std::make_unique<Group>());
  auto holder = register_module("embeddings", std::make_shared<runtime::nn::Module>("ModuleDict"));
  auto add_shard = [&](Group& g, size_t t, const ShardMetadata& s) {
    const EmbeddingConfig& c = configs_[t];
    EmbeddingConfig local = c;
    local.shard = runtime::sparse::TableShard{s.row_offset, s.num_rows, s.col_offset, s.num_cols};
    g.table_cfg.push_back(t);
    g.module.push_back(holder->register_module(
        c.name, std::make_shared<EmbeddingTable>("Embedding", local, options_.dtype, false)));
    g.optimizer.add_table(c.optimizer, s.num_rows, s.num_cols, options_.dtype,
                          "embeddings." + c.name + ".weight");
  };

  for (size_t t = 0; t < configs_.size(); ++t) {
    const EmbeddingConfig& c = configs_[t];
    const ParameterSharding& p = plan_.at(c.name);
    if (p.type == ShardingType::DataParallel) {
      Group& g = *groups_[kDP];
      g.present = true;
      add_shard(g, t, p.shards[size_t(me)]);
      for (size_t f : table_features[t]) {
        g.layout.feature_table.push_back(int64_t(g.module.size() - 1));
        g.layout.feature_names.push_back(feature_names_[f]);
        P.dp_features.push_back(int64_t(f));
      }
      continue;
    }
    // table_wise, column_wise, row_wise, table_row_wise: every non-empty shard gets the ids it
    // holds (sharding_plan.h gives each shard's block and rank).
    Group& g = *groups_[kSharded];
    g.present = true;
    for (const ShardMetadata& s : p.shards) {
      if (s.num_rows == 0 || s.num_cols == 0) continue;
      if (s.rank == me) add_shard(g, t, s);
      for (size_t f : table_features[t])
        P.send[size_t(s.rank)].push_back(
            {f, s.row_offset, s.row_offset + s.num_rows, s.col_offset, s.num_cols});
    }
  }
  const Group& sh = *groups_[kSharded];
  for (const Plan::Pair& pr : P.send[size_t(me)])
    P.recv_lookup.push_back(sh.lookup_of(P.feature_table[pr.feature]));
  xplan_ = std::move(x);
}

runtime::TableGradSink ShardedEmbeddingCollection::make_sink(int k) {
  if (!is_training()) return nullptr;
  return [this, k](std::vector<RowSparseGrad>& grads) {
    Group& g = *groups_[size_t(k)];
    runtime::NoGradGuard no_grad;
    std::vector<RowSparseGrad> mine =
        k == kDP ? all_reduce_row_grads(*group_, g.weights(), grads, options_.dtype,
                                        "sec.dp.grad_all_reduce")
                 : std::move(grads);
    if (options_.gradient_mode == GradientMode::Fused)
      g.optimizer.step(g.weights(), mine);
    else
      runtime::sparse::accumulate(g.sparse_grads, mine);
  };
}

EmbeddingCollectionOutput ShardedEmbeddingCollection::operator()(
    const KeyedJaggedTensor& features) {
  return forward(features);
}

EmbeddingCollectionOutput ShardedEmbeddingCollection::forward(const KeyedJaggedTensor& features) {
  const Plan& P = *xplan_;
  const int W = P.world, me = P.rank;
  const size_t nw = size_t(W);
  // Validate and arrange this rank's input before any collective.
  features.validate();
  const KeyedJaggedTensor kjt =
      features.keys() == feature_names_ ? features : features.select_keys(feature_names_);
  for (size_t f = 0; f < feature_names_.size(); ++f) {
    const EmbeddingConfig& c = configs_[P.feature_table[f]];
    kjt.validate_ids(feature_names_[f], c.num_embeddings, c.name);
  }
  const int64_t B = kjt.stride();
  const int64_t F = int64_t(feature_names_.size());
  const TensorOptions opts = TensorOptions{}.with_dtype(options_.dtype);
  const bool grad = is_training() && runtime::GradMode::enabled();

  const Tensor values_t = kjt.values().contiguous();
  const Tensor offsets_t = kjt.offsets().contiguous();
  const int64_t* val = values_t.data<int64_t>();
  const int64_t* off = offsets_t.data<int64_t>();
  // Feature f's values are val[vbeg[f], vbeg[f + 1]); its rows start at element obase[f] of out.
  std::vector<int64_t> vbeg(size_t(F) + 1), obase(size_t(F) + 1, 0);
  for (int64_t f = 0; f <= F; ++f) vbeg[size_t(f)] = off[f * B];
  for (int64_t f = 0; f < F; ++f)
    obase[size_t(f) + 1] =
        obase[size_t(f)] + (vbeg[size_t(f) + 1] - vbeg[size_t(f)]) * feature_dims_[size_t(f)];

  // ---- input dist: one count per pair, then the ids ------------------------------------------
  // place: where each element the owners return lands in `out` (owner by owner, pair by pair,
  // id by id, column by column): the output dist's index.
  std::vector<int64_t> send_cnt, send_val, place, cnt_split(nw), val_split(nw), ret_split(nw, 0);
  for (int j = 0; j < W; ++j) {
    const size_t v0 = send_val.size();
    for (const Plan::Pair& pr : P.send[size_t(j)]) {
      const size_t f = pr.feature;
      const int64_t dim = feature_dims_[f];
      int64_t n = 0;
      for (int64_t i = vbeg[f]; i < vbeg[f + 1]; ++i) {
        if (val[i] < pr.lo || val[i] >= pr.hi) continue;
        send_val.push_back(val[i] - pr.lo);
        const int64_t at = obase[f] + (i - vbeg[f]) * dim + pr.col;
        for (int64_t c = 0; c < pr.cols; ++c) place.push_back(at + c);
        ++n;
      }
      send_cnt.push_back(n);
      ret_split[size_t(j)] += n * pr.cols;
    }
    cnt_split[size_t(j)] = int64_t(P.send[size_t(j)].size());
    val_split[size_t(j)] = int64_t(send_val.size() - v0);
  }
  const size_t K = P.send[size_t(me)].size();  // pairs this rank looks up, per source
  const std::vector<int64_t> recv_cnt_split(nw, int64_t(K));
  std::vector<int64_t> recv_cnt;
  std::vector<int64_t> val_recv_split(nw, 0), out_split(nw, 0);
  Tensor recv_val;
  {
    runtime::NoGradGuard no_grad;
    recv_cnt = all_to_all_rows(group_, i64_tensor(send_cnt), recv_cnt_split, cnt_split,
                               "sec.input.lengths")
                   .to_vector<int64_t>();
    for (int r = 0; r < W; ++r)
      for (size_t k = 0; k < K; ++k) {
        const int64_t n = recv_cnt[size_t(r) * K + k];
        val_recv_split[size_t(r)] += n;
        out_split[size_t(r)] += n * P.send[size_t(me)][k].cols;
      }
    recv_val = all_to_all_rows(group_, i64_tensor(send_val), val_recv_split, val_split,
                               "sec.input.values");
  }

  // ---- lookups -----------------------------------------------------------------------------
  Tensor L_dp, L_sh;
  std::vector<int64_t> dp_base;  // element offset in L_dp of each data_parallel feature
  if (groups_[kDP]->present) {
    Group& g = *groups_[kDP];
    if (P.dp_features.empty()) {  // replicated tables that no feature reads
      L_dp = runtime::zeros({0}, opts);
    } else {
      const KeyedJaggedTensor sub = kjt.permute(P.dp_features);
      L_dp = runtime::embedding_lookup_batched(g.weights(), sub.values(), sub.offsets(), B,
                                               g.layout, make_sink(kDP));
    }
    int64_t pos = 0;
    for (int64_t f : P.dp_features) {
      dp_base.push_back(pos);
      pos += obase[size_t(f) + 1] - obase[size_t(f)];
    }
  }
  if (groups_[kSharded]->present) {
    Group& g = *groups_[kSharded];
    if (K == 0) {
      L_sh = runtime::zeros({0}, opts);  // this rank owns no shard
    } else {
      // One lookup "feature" per (source, pair) block, batch size 1: the output is in the order
      // the output all-to-all sends it.
      runtime::TableBatchLayout layout;
      std::vector<int64_t> o{0};
      for (int r = 0; r < W; ++r)
        for (size_t k = 0; k < K; ++k) {
          layout.feature_table.push_back(P.recv_lookup[k]);
          layout.feature_names.push_back(feature_names_[P.send[size_t(me)][k].feature]);
          o.push_back(o.back() + recv_cnt[size_t(r) * K + k]);
        }
      L_sh = runtime::embedding_lookup_batched(g.weights(), recv_val, i64_tensor(o), 1, layout,
                                               make_sink(kSharded));
    }
  }

  // ---- output dist ---------------------------------------------------------------------------
  const Tensor place_t = i64_tensor(place);
  Tensor out = runtime::zeros({obase.back()}, opts);
  {
    runtime::NoGradGuard no_grad;
    if (L_dp.defined())
      for (size_t i = 0; i < P.dp_features.size(); ++i) {
        const size_t f = size_t(P.dp_features[i]);
        const int64_t n = obase[f + 1] - obase[f];
        if (n > 0) out.narrow(0, obase[f], n).copy_(L_dp.detach().narrow(0, dp_base[i], n));
      }
    if (L_sh.defined()) {
      const Tensor back =
          all_to_all_rows(group_, L_sh.detach(), ret_split, out_split, "sec.output.rows");
      if (back.numel() > 0) runtime::index_add_(out, 0, place_t, back);
    }
  }

  // ---- autograd: the output exchange's backward, one node -------------------------------------
  if (grad) {
    std::vector<Tensor> inputs{anchor_};
    std::vector<int> input_kind{-1};
    if (L_dp.defined() && L_dp.requires_grad()) {
      inputs.push_back(L_dp);
      input_kind.push_back(kDP);
    }
    if (L_sh.defined() && L_sh.requires_grad()) {
      inputs.push_back(L_sh);
      input_kind.push_back(kSharded);
    }
    const bool has_dp = L_dp.defined(), has_sh = L_sh.defined();
    std::vector<std::pair<int64_t, int64_t>> dp_blocks;  // (out element, n) per dp feature
    for (int64_t f : P.dp_features)
      dp_blocks.push_back({obase[size_t(f)], obase[size_t(f) + 1] - obase[size_t(f)]});
    runtime::autograd::record(
        "sharded_embedding_collection", inputs, {out},
        [this, has_dp, has_sh, dp_blocks, place_t, ret_split, out_split, input_kind, opts,
         anchor = anchor_](const runtime::autograd::BackwardArgs& args) {
          const Tensor g = args.grad(0).contiguous();
          Tensor g_dp, g_sh;
          if (has_dp) {
            std::vector<Tensor> parts;
            for (const auto& [at, n] : dp_blocks) parts.push_back(g.narrow(0, at, n));
            g_dp = parts.empty() ? runtime::zeros({0}, opts) : runtime::cat(parts, 0);
          }
          if (has_sh) {  // every rank, whatever the data
            const Tensor rows = runtime::index_select(g, 0, place_t);
            g_sh = all_to_all_rows(group_, rows, out_split, ret_split, "sec.output.rows.backward");
          }
          std::vector<Tensor> grads;
          for (int k : input_kind)
            grads.push_back(k < 0 ? runtime::zeros_like(anchor) : k == kDP ? g_dp : g_sh);
          return grads;
        });
  }

  EmbeddingCollectionOutput result;
  result.keys = feature_names_;
  result.flat = out;
  for (int64_t k = 0; k < F; ++k) {
    runtime::sparse::JaggedTensor jt = kjt.key_view(k);
    const int64_t n = jt.values.numel();
    jt.values = out.narrow(0, obase[size_t(k)], n * feature_dims_[size_t(k)])
                    .view({n, feature_dims_[size_t(k)]});
    jt.weights = Tensor();
    result.per_key.push_back(std::move(jt));
  }
  return result;
}

std::vector<LocalShard> ShardedEmbeddingCollection::local_shards() const {
  std::vector<LocalShard> out;
  const int me = group_->rank();
  for (size_t t = 0; t < configs_.size(); ++t) {
    const EmbeddingConfig& c = configs_[t];
    const ParameterSharding& p = plan_.at(c.name);
    const Group& g = *groups_[p.type == ShardingType::DataParallel ? kDP : kSharded];
    const int lt = g.lookup_of(t);
    if (lt < 0) continue;
    for (const ShardMetadata& s : p.shards) {
      if (s.rank != me || s.num_rows == 0 || s.num_cols == 0) continue;
      out.push_back(LocalShard{c.name,
                               "embeddings." + c.name + ".weight",
                               p.type,
                               s,
                               {c.num_embeddings, c.embedding_dim},
                               p.type == ShardingType::DataParallel,
                               g.module[size_t(lt)]->weight});
    }
  }
  return out;
}

runtime::nn::StateDict ShardedEmbeddingCollection::optimizer_state_dict() const {
  return merged_optimizer_state(groups_);
}

void ShardedEmbeddingCollection::load_optimizer_state_dict(const runtime::nn::StateDict& state) {
  load_optimizer_state_by_group(groups_, state, "ShardedEmbeddingCollection", group_->rank());
}

void ShardedEmbeddingCollection::set_lr(double lr) { set_groups_lr(groups_, lr); }

std::vector<ShardedEmbeddingBagCollection::ShardGrad> ShardedEmbeddingCollection::sparse_grads()
    const {
  std::vector<ShardedEmbeddingBagCollection::ShardGrad> out;
  for (const auto& g : groups_)
    for (const RowSparseGrad& r : g->sparse_grads)
      out.push_back(
          {"embeddings." + configs_[g->table_cfg.at(size_t(r.table))].name + ".weight", r});
  return out;
}

double ShardedEmbeddingCollection::sparse_grad_norm_pow(double norm_type) const {
  return groups_sparse_norm_pow(groups_, norm_type, [&](size_t k) {
    return k != kDP || group_->rank() == 0;  // replicas count once
  });
}

void ShardedEmbeddingCollection::scale_sparse_grads_(double coef) {
  scale_groups_sparse_grads(groups_, coef);
}

void ShardedEmbeddingCollection::apply_sparse_grads() {
  apply_groups_sparse_grads(groups_, [](const Group& g) { return g.weights(); });
}

void ShardedEmbeddingCollection::zero_sparse_grads() { zero_groups_sparse_grads(groups_); }

}  // namespace mt::parallel
