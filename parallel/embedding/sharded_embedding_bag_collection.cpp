// The sharded collection: exchange plan, input dist, per-group lookups, output dist and its
// backward (see the header for the protocol).
#include "parallel/embedding/sharded_embedding_bag_collection.h"
#include "parallel/embedding/sharded_embedding_bag_group.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <numeric>

#include "parallel/embedding/embedding_dist.h"
#include "parallel/embedding/shard_group_optimizers.h"
#include "parallel/expert/token_exchange.h"
#include "runtime/autograd/function.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/embedding_bag.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"
#include "runtime/ops/join.h"
#include "runtime/sparse/row_sparse_grad.h"

namespace mt::parallel {

using namespace sharded_ebc;
using runtime::DType;
using runtime::RowSparseGrad;
using runtime::Tensor;
using runtime::TensorOptions;
using runtime::sparse::EmbeddingTable;
using runtime::sparse::GradientMode;
using runtime::sparse::KvTable;
using runtime::sparse::KvWorkingSet;
using runtime::sparse::TableStorage;
using runtime::sparse::TableUpdate;
using runtime::sparse::KeyedJaggedTensor;
using runtime::sparse::KeyedTensor;

namespace {


Kind kind_of(ShardingType t) {
  switch (t) {
    case ShardingType::DataParallel:
      return kDP;
    case ShardingType::TableWise:
    case ShardingType::ColumnWise:
      return kTW;
    case ShardingType::RowWise:
      return kRW;
    case ShardingType::TableRowWise:
      return kTWRW;
  }
  return kTW;
}

// A 1-D contiguous view (no -1 inference: tensors here may have 0 elements).
Tensor flat(const Tensor& t) { return t.contiguous().view({t.numel()}); }

int64_t sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t(0));
}


// Copies src [B, w] into dst's columns [col, col + w), multiplied by scale [B, 1] when defined.
void put_cols(const Tensor& dst, int64_t col, const Tensor& src, const Tensor& scale) {
  if (src.numel() == 0) return;
  const Tensor d = dst.narrow(1, col, src.size(1));
  if (scale.defined())
    d.copy_(runtime::mul(src, scale));
  else
    d.copy_(src);
}

// The hash part (part, parts) a raw-id table's shard `s` keeps: its index among the table's row
// shards (the plan's shard order: rank order for row_wise, local index for table_row_wise).
std::pair<int64_t, int64_t> raw_part_of(const ParameterSharding& p, const ShardMetadata& s) {
  for (size_t i = 0; i < p.shards.size(); ++i)
    if (p.shards[i].rank == s.rank && p.shards[i].row_offset == s.row_offset)
      return {int64_t(i), int64_t(p.shards.size())};
  MT_FAIL("ShardedEmbeddingBagCollection: a shard of rank ", s.rank, " is not in its plan");
}

// A kv-backed shard in the module tree: no parameters; init_weights gives the shard its init key
// (the same (seed, FQN) key the in-memory table draws from) and starts it over.
class KvShardModule : public runtime::nn::Module {
 public:
  explicit KvShardModule(std::shared_ptr<KvTable> kv)
      : Module("KvEmbeddingBag"), kv_(std::move(kv)) {}
  void reset_parameters(const runtime::nn::InitContext& ctx) override {
    kv_->set_init(ctx);
    kv_->clear();
  }

 private:
  std::shared_ptr<KvTable> kv_;
};

}  // namespace

// What every rank derives from the sharding plan: who sends which feature to whom.
struct ShardedEmbeddingBagCollection::Plan {
  struct Feature {
    size_t table;
    int64_t dim;
    int64_t out_col;  // first column in the output
    bool mean;        // MEAN pooling
    ShardingType type;
  };
  // One feature sent to a rank: its ids in rows [lo, hi) of the table, made local (id - lo);
  // raw-id tables split over `parts` shards (parts > 0): the ids raw_id_owner gives `part`, as
  // they are.
  struct Send {
    size_t feature;
    int64_t lo, hi;
    int64_t part = 0, parts = 0;
    bool takes(int64_t id) const {
      return parts > 0 ? runtime::sparse::raw_id_owner(id, parts) == part : id >= lo && id < hi;
    }
    int64_t local(int64_t id) const { return parts > 0 ? id : id - lo; }
  };
  // A table_wise / column_wise feature an owner looks up: output columns [col, col + cols) of
  // the feature (the shard's columns).
  struct TwEntry {
    size_t feature;
    int64_t col, cols;
  };
  int world = 1, rank = 0, local = 1, nodes = 1;
  std::vector<Feature> features;
  std::vector<std::vector<Send>> send;   // [dest rank]
  std::vector<std::vector<TwEntry>> tw;  // [owner rank]
  std::vector<int64_t> tw_width;         // [owner rank]
  std::vector<size_t> dp_features, rw_features;
  int64_t dp_width = 0, rw_width = 0;
  std::vector<std::vector<size_t>> twrw_features;  // [node]
  std::vector<int64_t> twrw_width;                 // [node]
  // Sections of what this rank receives (in send[rank] order): tw, rw, twrw counts.
  size_t recv_tw = 0, recv_rw = 0, recv_twrw = 0;
};

ShardedEmbeddingBagCollection::ShardedEmbeddingBagCollection(
    std::vector<EmbeddingBagConfig> tables, ShardingPlan plan, std::shared_ptr<ProcessGroup> group,
    std::shared_ptr<DeviceMesh> mesh, runtime::sparse::CollectionOptions options,
    std::shared_ptr<ProcessGroup> output_group)
    : Module("ShardedEmbeddingBagCollection"),
      configs_(std::move(tables)),
      plan_(std::move(plan)),
      group_(std::move(group)),
      output_group_(output_group ? std::move(output_group) : group_),
      mesh_(std::move(mesh)),
      options_(options) {
  MT_CHECK(group_ != nullptr, "ShardedEmbeddingBagCollection: no process group");
  if (output_group_ != group_) {
    MT_CHECK(output_group_->size() == group_->size(), "ShardedEmbeddingBagCollection: the output ",
             "group ", output_group_->name(), " has ", output_group_->size(),
             " ranks but the group ", group_->name(), " has ", group_->size());
    // Every rank gets the same verdict: the output group's rank of each rank of `group`.
    const Tensor mine = runtime::from_vector<int64_t>({output_group_->rank()}, {1, 1}, i64());
    const std::vector<int64_t> order =
        all_gather_rows(*group_, mine, "sebc.output_group_order").to_vector<int64_t>();
    for (int64_t r = 0; r < int64_t(order.size()); ++r)
      MT_CHECK(order[size_t(r)] == r, "ShardedEmbeddingBagCollection: the output group ",
               output_group_->name(), " must hold the ranks of ", group_->name(),
               " in its order, but rank ", r, " of ", group_->name(), " is its rank ",
               order[size_t(r)]);
  }
  MT_CHECK(options_.gradient_mode != GradientMode::Dense,
           "ShardedEmbeddingBagCollection: GradientMode::Dense is not supported (shards are "
           "stepped by their row optimizers); use Fused or RowSparse");
  MT_CHECK(options_.dtype == DType::F32 || options_.dtype == DType::F64,
           "ShardedEmbeddingBagCollection: tables must be f32 or f64, got ",
           runtime::dtype_name(options_.dtype));
  MT_CHECK(plan_.world_size == group_->size(), "ShardedEmbeddingBagCollection: the plan is for ",
           plan_.world_size, " ranks but the group ", group_->name(), " has ", group_->size());
  for (const EmbeddingBagConfig& t : configs_)
    MT_CHECK(t.shard.row_offset == 0 && t.shard.col_offset == 0 &&
                 (t.shard.num_rows < 0 || t.shard.num_rows == t.num_embeddings) &&
                 (t.shard.num_cols < 0 || t.shard.num_cols == t.embedding_dim),
             "ShardedEmbeddingBagCollection: table '", t.name,
             "' must be given whole (the plan says where its shards go), not as a shard");
  plan_.validate(configs_);
  bool has_twrw = false;
  for (const auto& [name, p] : plan_.tables) has_twrw |= p.type == ShardingType::TableRowWise;
  if (has_twrw) {
    MT_CHECK(mesh_ != nullptr && mesh_->ndim() == 2,
             "ShardedEmbeddingBagCollection: table_row_wise tables need a 2-D (node, local) mesh");
    MT_CHECK(mesh_->size() == group_->size() && mesh_->rank() == group_->rank(),
             "ShardedEmbeddingBagCollection: the mesh ", mesh_->describe(),
             " must lay out the group's ranks (size ", group_->size(), ", rank ", group_->rank(),
             "), got size ", mesh_->size(), " and rank ", mesh_->rank());
    MT_CHECK(mesh_->size(1) == plan_.ranks_per_node(),
             "ShardedEmbeddingBagCollection: the plan has ", plan_.ranks_per_node(),
             " ranks per node but the mesh ", mesh_->describe(), " has ", mesh_->size(1));
  }
  build();
  anchor_ = runtime::zeros({0}, TensorOptions{}.with_dtype(options_.dtype));
  anchor_.set_requires_grad(true);
}

ShardedEmbeddingBagCollection::~ShardedEmbeddingBagCollection() = default;

void ShardedEmbeddingBagCollection::build() {
  auto x = std::make_unique<Plan>();
  Plan& P = *x;
  P.world = group_->size();
  P.rank = group_->rank();
  P.local = plan_.ranks_per_node();
  P.nodes = P.world / P.local;
  const int W = P.world, me = P.rank, node = me / P.local;
  P.send.resize(static_cast<size_t>(W));
  P.tw.resize(static_cast<size_t>(W));
  P.tw_width.assign(size_t(W), 0);
  P.twrw_features.resize(static_cast<size_t>(P.nodes));
  P.twrw_width.assign(size_t(P.nodes), 0);

  // Output layout: features table by table, as the unsharded collection.
  int64_t col = 0;
  for (size_t t = 0; t < configs_.size(); ++t) {
    const EmbeddingBagConfig& c = configs_[t];
    for (const std::string& f : c.feature_names) {
      MT_CHECK(std::find(feature_names_.begin(), feature_names_.end(), f) == feature_names_.end(),
               "ShardedEmbeddingBagCollection: feature '", f, "' is listed by more than one table");
      feature_names_.push_back(f);
      feature_dims_.push_back(c.embedding_dim);
      P.features.push_back({t, c.embedding_dim, col, c.pooling == runtime::PoolingMode::Mean,
                            plan_.at(c.name).type});
      col += c.embedding_dim;
    }
  }

  groups_.clear();
  for (int k = 0; k < kKinds; ++k) {
    groups_.push_back(std::make_unique<Group>());
    groups_.back()->kind = Kind(k);
  }
  auto holder =
      register_module("embedding_bags", std::make_shared<runtime::nn::Module>("ModuleDict"));
  const bool dense_grad = false;
  // Adds this rank's shard `s` of table t to group g (a placeholder when it has no rows).
  uint32_t kv_tables = 0;  // ids of this rank's kv shards in its store
  auto add_shard = [&](Group& g, size_t t, const ShardMetadata& s) {
    const EmbeddingBagConfig& c = configs_[t];
    g.table_cfg.push_back(t);
    g.alias_of.push_back(-1);
    g.update.push_back(c.update);
    g.ws.emplace_back();
    if (s.num_rows == 0) {
      g.module.push_back(nullptr);
      g.kv.push_back(nullptr);
      g.placeholder.push_back(
          runtime::zeros({0, s.num_cols},
                         TensorOptions{}.with_dtype(options_.dtype).with_device(options_.device)));
      g.opt_index.push_back(-1);
      return;
    }
    EmbeddingBagConfig local = c;
    // A raw-id shard holds ids, not a row block: offset 0, its planned rows as the expected count.
    local.shard = runtime::sparse::TableShard{c.raw_ids ? 0 : s.row_offset, s.num_rows,
                                              s.col_offset, s.num_cols};
    // Frozen tables keep no optimizer state (their rows never step).
    runtime::sparse::EmbeddingOptimizerConfig opt = c.optimizer;
    if (c.update != TableUpdate::Train) opt.type = runtime::sparse::EmbOptimType::SGD;
    if (c.storage == TableStorage::Kv) {
      if (!kv_store_)
        kv_store_ = runtime::sparse::KvStore::open_scratch(
            std::filesystem::path(options_.kv.path) / ("rank-" + std::to_string(group_->rank())));
      runtime::sparse::KvTableOptions ko;
      ko.policy = options_.kv.policy;
      ko.device = options_.device;  // a GPU keeps the cache in device memory
      ko.tensor_cache = options_.kv.tensor_cache;
      ko.cache_rows = c.kv_cache.rows_for(s.num_rows);
      if (c.raw_ids) std::tie(ko.raw_part, ko.raw_parts) = raw_part_of(plan_.at(c.name), s);
      local.optimizer = opt;
      auto kv = std::make_shared<KvTable>(kv_store_, kv_tables++, local, options_.dtype,
                                          c.update == TableUpdate::Train, ko);
      holder->register_module(c.name, std::make_shared<KvShardModule>(kv));
      g.module.push_back(nullptr);
      g.kv.push_back(kv);
      g.ws.back().weight = runtime::zeros(
          {0, s.num_cols}, TensorOptions{}.with_dtype(options_.dtype).with_device(options_.device));
      g.has_kv = true;
    } else {
      g.module.push_back(holder->register_module(
          c.name,
          std::make_shared<EmbeddingTable>("EmbeddingBag", local, options_.dtype, dense_grad)));
      g.kv.push_back(nullptr);
    }
    g.placeholder.push_back(Tensor());
    g.opt_index.push_back(int(g.opt_lookup.size()));
    g.opt_lookup.push_back(g.module.size() - 1);
    g.optimizer.add_table(opt, c.storage == TableStorage::Kv ? 0 : s.num_rows, s.num_cols,
                          options_.dtype, "embedding_bags." + c.name + ".weight");
    if (c.storage == TableStorage::Kv) g.optimizer.set_external_state(g.opt_lookup.size() - 1);
  };
  // The shard add_shard added last to g (aliases come after it).
  auto last_shard = [](const Group& g) {
    size_t i = g.alias_of.size() - 1;
    while (g.alias_of[i] >= 0) --i;
    return i;
  };
  // Lookup features of group g reading lookup table `lt` (a read-only alias of it when the
  // table lists update_features without this feature).
  auto add_feature = [&](Group& g, size_t f, size_t lt, bool sum_pool) {
    const EmbeddingBagConfig& c = configs_[P.features[f].table];
    const auto& upd = c.update_features;
    if (!upd.empty() && std::find(upd.begin(), upd.end(), feature_names_[f]) == upd.end()) {
      size_t alias = 0;
      while (alias < g.alias_of.size() && g.alias_of[alias] != int(lt)) ++alias;
      if (alias == g.alias_of.size()) {
        g.table_cfg.push_back(g.table_cfg[lt]);
        g.alias_of.push_back(int(lt));
        g.update.push_back(TableUpdate::Frozen);
        g.module.push_back(nullptr);
        g.kv.push_back(nullptr);
        g.placeholder.push_back(Tensor());
        g.opt_index.push_back(-1);
        g.ws.emplace_back();
      }
      lt = alias;
    }
    g.layout.feature_table.push_back(int64_t(lt));
    g.layout.feature_pooling.push_back(sum_pool ? runtime::PoolingMode::Sum
                                                : configs_[P.features[f].table].pooling);
    g.layout.feature_names.push_back(feature_names_[f]);
  };

  // Walk the tables in config order; every rank computes the same sends.
  std::vector<std::vector<size_t>> table_features(configs_.size());
  for (size_t f = 0; f < P.features.size(); ++f) table_features[P.features[f].table].push_back(f);
  // Sections are appended per destination in this order: tw entries, rw, twrw.
  const size_t nw = static_cast<size_t>(W);
  std::vector<std::vector<Plan::Send>> send_tw(nw), send_rw(nw), send_twrw(nw);
  for (size_t t = 0; t < configs_.size(); ++t) {
    const EmbeddingBagConfig& c = configs_[t];
    const ParameterSharding& p = plan_.at(c.name);
    const Kind k = kind_of(p.type);
    Group& g = *groups_[size_t(k)];
    g.present = true;
    if (c.storage == TableStorage::Kv) {
      MT_CHECK(k != kDP, "ShardedEmbeddingBagCollection: table '", c.name,
               "' is kv-backed and cannot be data_parallel (each replica would keep its own "
               "store); shard it table_wise, column_wise, row_wise or table_row_wise");
      MT_CHECK(!options_.kv.path.empty(), "ShardedEmbeddingBagCollection: table '", c.name,
               "' is kv-backed but CollectionOptions::kv.path (the stores' folder) is empty");
    }
    if (c.raw_ids) {
      MT_CHECK(p.type != ShardingType::ColumnWise, "ShardedEmbeddingBagCollection: table '",
               c.name, "' keys raw ids and cannot be column_wise (not built yet); shard it "
               "table_wise, row_wise or table_row_wise");
      for (const ShardMetadata& s : p.shards)
        MT_CHECK(s.num_rows > 0, "ShardedEmbeddingBagCollection: table '", c.name,
                 "' keys raw ids but the plan gives rank ", s.rank, " an empty row block: raise "
                 "its num_embeddings (the rows it is expected to hold) to at least its shards'",
                 " count, ", p.shards.size());
    }
    switch (k) {
      case kDP: {
        add_shard(g, t, p.shards[size_t(me)]);
        for (size_t f : table_features[t]) {
          add_feature(g, f, last_shard(g), false);
          P.dp_features.push_back(f);
          P.dp_width += c.embedding_dim;
        }
        break;
      }
      case kTW: {
        for (const ShardMetadata& s : p.shards) {
          const bool mine = s.rank == me;
          if (mine) add_shard(g, t, s);
          for (size_t f : table_features[t]) {
            send_tw[size_t(s.rank)].push_back(
                {f, 0, c.raw_ids ? std::numeric_limits<int64_t>::max() : c.num_embeddings});
            P.tw[size_t(s.rank)].push_back({f, s.col_offset, s.num_cols});
            P.tw_width[size_t(s.rank)] += s.num_cols;
            if (mine) add_feature(g, f, last_shard(g), false);
          }
        }
        break;
      }
      case kRW: {
        add_shard(g, t, p.shards[size_t(me)]);
        for (size_t f : table_features[t]) {
          for (int j = 0; j < W; ++j) {
            const ShardMetadata& s = p.shards[size_t(j)];
            send_rw[size_t(j)].push_back(c.raw_ids ? Plan::Send{f, 0, 0, j, W}
                                                   : Plan::Send{f, s.row_offset,
                                                                s.row_offset + s.num_rows});
          }
          add_feature(g, f, last_shard(g), true);
          P.rw_features.push_back(f);
          P.rw_width += c.embedding_dim;
        }
        break;
      }
      case kTWRW: {
        const int n = p.ranks.front() / P.local;
        if (n == node) add_shard(g, t, p.shards[size_t(me % P.local)]);
        for (size_t f : table_features[t]) {
          for (int l = 0; l < P.local; ++l) {
            const ShardMetadata& s = p.shards[size_t(l)];
            send_twrw[size_t(n * P.local + l)].push_back(
                c.raw_ids ? Plan::Send{f, 0, 0, l, P.local}
                          : Plan::Send{f, s.row_offset, s.row_offset + s.num_rows});
          }
          if (n == node) add_feature(g, f, last_shard(g), true);
          P.twrw_features[size_t(n)].push_back(f);
          P.twrw_width[size_t(n)] += c.embedding_dim;
        }
        break;
      }
      default:
        break;
    }
  }
  for (int j = 0; j < W; ++j) {
    auto& s = P.send[size_t(j)];
    s.insert(s.end(), send_tw[size_t(j)].begin(), send_tw[size_t(j)].end());
    s.insert(s.end(), send_rw[size_t(j)].begin(), send_rw[size_t(j)].end());
    s.insert(s.end(), send_twrw[size_t(j)].begin(), send_twrw[size_t(j)].end());
  }
  P.recv_tw = send_tw[size_t(me)].size();
  P.recv_rw = send_rw[size_t(me)].size();
  P.recv_twrw = send_twrw[size_t(me)].size();
  xplan_ = std::move(x);
  if (options_.device != runtime::Device::cpu()) holder->to(options_.device);
}

KeyedTensor ShardedEmbeddingBagCollection::operator()(const KeyedJaggedTensor& features) {
  return forward(features);
}

// Validation, batch sizes and the input dist: each group's lookup input.
ShardedEmbeddingBagCollection::Routed ShardedEmbeddingBagCollection::route(
    const KeyedJaggedTensor& features) {
  const Plan& P = *xplan_;
  const int W = P.world, me = P.rank;
  // Validate and arrange this rank's input before any collective.
  features.validate();
  for (const auto& g : groups_)
    for (const Tensor& w : g->lookup_weights())
      MT_CHECK(w.device() == options_.device, "ShardedEmbeddingBagCollection: a shard is on ",
               w.device(), " but the collection was built on ", options_.device,
               " (Module::to does not move a sharded collection: build it where it trains)");
  Routed out;
  out.kjt = features.keys() == feature_names_ ? features : features.select_keys(feature_names_);
  const KeyedJaggedTensor& kjt = out.kjt;
  for (size_t f = 0; f < P.features.size(); ++f) {
    const EmbeddingBagConfig& c = configs_[P.features[f].table];
    kjt.validate_ids(feature_names_[f],
                     c.raw_ids ? std::numeric_limits<int64_t>::max() : c.num_embeddings, c.name);
  }
  const bool weighted = options_.is_weighted;
  // A batch without ids needs no weights (an empty batch is often built without them).
  MT_CHECK(!weighted || kjt.has_weights() || kjt.num_values() == 0,
           "ShardedEmbeddingBagCollection: is_weighted is set but the input has no weights");
  const int64_t B = kjt.stride();

  // Batch sizes of every rank.
  const std::vector<int64_t> Bs = all_gather_batch_sizes(*group_, B, "sebc.batch_sizes");
  std::vector<int64_t> Boff(size_t(W) + 1, 0);
  for (int r = 0; r < W; ++r) Boff[size_t(r) + 1] = Boff[size_t(r)] + Bs[size_t(r)];
  const int64_t G = Boff.back();

  // Host views of the input.
  const Tensor values_t = kjt.values().contiguous();
  out.offsets = kjt.offsets().contiguous();
  const Tensor& offsets_t = out.offsets;
  const Tensor weights_t = !weighted ? Tensor()
                           : kjt.has_weights()
                               ? kjt.weights().contiguous().to(DType::F32)
                               : runtime::zeros({0}, TensorOptions{}.with_dtype(DType::F32));
  const int64_t* val = values_t.data<int64_t>();
  const int64_t* off = offsets_t.data<int64_t>();
  const float* wts = weighted ? weights_t.data<float>() : nullptr;

  // ---- input dist: lengths, then values (and weights) ----------------------------------------
  std::vector<int64_t> send_len, send_val, len_split(static_cast<size_t>(W)),
      val_split(static_cast<size_t>(W));
  std::vector<float> send_w;
  for (int j = 0; j < W; ++j) {
    const size_t v0 = send_val.size();
    for (const Plan::Send& s : P.send[size_t(j)]) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t lo = off[int64_t(s.feature) * B + b],
                      hi = off[int64_t(s.feature) * B + b + 1];
        int64_t n = 0;
        for (int64_t i = lo; i < hi; ++i) {
          if (!s.takes(val[i])) continue;
          send_val.push_back(s.local(val[i]));
          if (weighted) send_w.push_back(wts[i]);
          ++n;
        }
        send_len.push_back(n);
      }
    }
    len_split[size_t(j)] = int64_t(P.send[size_t(j)].size()) * B;
    val_split[size_t(j)] = int64_t(send_val.size() - v0);
  }
  const int64_t n_recv = int64_t(P.send[size_t(me)].size());
  std::vector<int64_t> len_recv_split(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) len_recv_split[size_t(r)] = n_recv * Bs[size_t(r)];
  const Tensor recv_len_t = exchange_rows(
      group_, runtime::from_vector<int64_t>(send_len, {int64_t(send_len.size())}, i64()),
      len_recv_split, len_split, "sebc.input.lengths");
  const std::vector<int64_t> recv_len = recv_len_t.to_vector<int64_t>();
  // Values from each source: the sum of its lengths.
  std::vector<int64_t> val_recv_split(size_t(W), 0);
  for (int r = 0; r < W; ++r) {
    const int64_t start = n_recv * Boff[size_t(r)];
    for (int64_t i = 0; i < len_recv_split[size_t(r)]; ++i)
      val_recv_split[size_t(r)] += recv_len[size_t(start + i)];
  }
  const Tensor recv_val_t = exchange_rows(
      group_, runtime::from_vector<int64_t>(send_val, {int64_t(send_val.size())}, i64()),
      val_recv_split, val_split, "sebc.input.values");
  Tensor recv_w_t;
  if (weighted)
    recv_w_t = exchange_rows(group_,
                             runtime::from_vector<float>(send_w, {int64_t(send_w.size())},
                                                         TensorOptions{}.with_dtype(DType::F32)),
                             val_recv_split, val_split, "sebc.input.weights");
  const std::vector<int64_t> recv_val = recv_val_t.to_vector<int64_t>();
  const std::vector<float> recv_w = weighted ? recv_w_t.to_vector<float>() : std::vector<float>();

  // Per (source r, received feature k): where its values start in recv_val.
  std::vector<std::vector<int64_t>> vstart(size_t(W), std::vector<int64_t>(size_t(n_recv) + 1, 0));
  {
    int64_t p = 0;
    for (int r = 0; r < W; ++r) {
      const int64_t lstart = n_recv * Boff[size_t(r)];
      for (int64_t k = 0; k < n_recv; ++k) {
        vstart[size_t(r)][size_t(k)] = p;
        for (int64_t b = 0; b < Bs[size_t(r)]; ++b)
          p += recv_len[size_t(lstart + k * Bs[size_t(r)] + b)];
      }
      vstart[size_t(r)][size_t(n_recv)] = p;
    }
  }
  // The lookup input of received features [k0, k1): feature-major, samples in source order.
  using LookupInput = Routed::LookupInput;
  auto gather_received = [&](int64_t k0, int64_t k1) {
    std::vector<int64_t> v, o{0};
    std::vector<float> w;
    for (int64_t k = k0; k < k1; ++k) {
      for (int r = 0; r < W; ++r) {
        const int64_t lstart = n_recv * Boff[size_t(r)] + k * Bs[size_t(r)];
        for (int64_t b = 0; b < Bs[size_t(r)]; ++b)
          o.push_back(o.back() + recv_len[size_t(lstart + b)]);
        const int64_t a = vstart[size_t(r)][size_t(k)], e = vstart[size_t(r)][size_t(k) + 1];
        v.insert(v.end(), recv_val.begin() + a, recv_val.begin() + e);
        if (weighted) w.insert(w.end(), recv_w.begin() + a, recv_w.begin() + e);
      }
    }
    LookupInput in;
    in.values = runtime::from_vector<int64_t>(v, {int64_t(v.size())}, i64());
    in.offsets = runtime::from_vector<int64_t>(o, {int64_t(o.size())}, i64());
    if (weighted)
      in.weights = runtime::from_vector<float>(w, {int64_t(w.size())},
                                               TensorOptions{}.with_dtype(DType::F32));
    return in;
  };

  out.inputs.resize(kKinds);
  for (int k = 0; k < kKinds; ++k) {
    const Group& g = *groups_[size_t(k)];
    if (!g.present || g.layout.feature_table.empty()) continue;
    LookupInput in;
    in.batch = G;
    if (k == kDP) {
      std::vector<int64_t> idx(P.dp_features.begin(), P.dp_features.end());
      const KeyedJaggedTensor sub = kjt.permute(idx);
      in.values = sub.values();
      in.offsets = sub.offsets();
      if (weighted) in.weights = sub.has_weights() ? sub.weights() : weights_t;
      in.batch = B;
    } else if (k == kTW) {
      in = gather_received(0, int64_t(P.recv_tw));
      in.batch = G;
    } else if (k == kRW) {
      in = gather_received(int64_t(P.recv_tw), int64_t(P.recv_tw + P.recv_rw));
      in.batch = G;
    } else {
      in = gather_received(int64_t(P.recv_tw + P.recv_rw), n_recv);
      in.batch = G;
    }
    out.inputs[size_t(k)] = std::move(in);
  }
  out.Bs = Bs;
  out.Boff = Boff;
  out.B = B;
  out.G = G;
  return out;
}

KeyedTensor ShardedEmbeddingBagCollection::forward(const KeyedJaggedTensor& features) {
  const Plan& P = *xplan_;
  const int W = P.world, me = P.rank;
  const Routed routed = route(features);
  const std::vector<int64_t>& Bs = routed.Bs;
  const std::vector<int64_t>& Boff = routed.Boff;
  const int64_t B = routed.B, G = routed.G;
  const int64_t* off = routed.offsets.data<int64_t>();
  const TensorOptions opts =
      TensorOptions{}.with_dtype(options_.dtype).with_device(options_.device);

  // ---- lookups ---------------------------------------------------------------------------------
  std::vector<Tensor> L(kKinds);
  for (int k = 0; k < kKinds; ++k) {
    Group& g = *groups_[size_t(k)];
    if (!g.present) continue;
    const Routed::LookupInput& in = routed.inputs[size_t(k)];
    if (!in.values.defined()) {  // e.g. a rank that owns no table_wise shard
      L[size_t(k)] = runtime::zeros({k == kDP ? B : G, 0}, opts);
      continue;
    }
    const Tensor values =
        g.has_kv ? gather_kv_rows(g, in.values, in.offsets, in.batch) : in.values;
    L[size_t(k)] = runtime::embedding_bags_batched(g.lookup_weights(), values, in.offsets,
                                                   in.batch, g.layout, in.weights, make_sink(k));
  }

  // ---- output dist -----------------------------------------------------------------------------
  // MEAN scales [B, 1] per feature (row_wise / table_row_wise pool as SUM on the owners).
  std::vector<Tensor> mean_scale(P.features.size());
  for (size_t f = 0; f < P.features.size(); ++f) {
    const Plan::Feature& pf = P.features[f];
    if (!pf.mean || (pf.type != ShardingType::RowWise && pf.type != ShardingType::TableRowWise))
      continue;
    std::vector<double> s(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = off[int64_t(f) * B + b + 1] - off[int64_t(f) * B + b];
      s[size_t(b)] = n > 0 ? 1.0 / double(n) : 0.0;
    }
    mean_scale[f] = runtime::from_vector<double>(s, {B, 1}, opts);
  }

  const int64_t D = sum(feature_dims_);
  Tensor out = runtime::zeros({B, D}, opts);
  const int node = me / P.local, lrank = me % P.local;
  // twrw bookkeeping: C[l] samples of ranks with local index l (all nodes), padded to Cmax.
  std::vector<int64_t> C(size_t(P.local), 0);
  for (int r = 0; r < W; ++r) C[size_t(r % P.local)] += Bs[size_t(r)];
  const int64_t Cmax = *std::max_element(C.begin(), C.end());
  const int64_t Bmax = *std::max_element(Bs.begin(), Bs.end());
  {
    runtime::NoGradGuard no_grad;
    if (groups_[kDP]->present) {
      const Tensor l = L[kDP].detach();
      int64_t c = 0;
      for (size_t f : P.dp_features) {
        put_cols(out, P.features[f].out_col, l.narrow(1, c, P.features[f].dim), Tensor());
        c += P.features[f].dim;
      }
    }
    if (groups_[kTW]->present) {
      const Tensor l = flat(L[kTW].detach());
      std::vector<int64_t> in_split(static_cast<size_t>(W)), out_split(static_cast<size_t>(W));
      for (int r = 0; r < W; ++r) {
        in_split[size_t(r)] = Bs[size_t(r)] * P.tw_width[size_t(me)];
        out_split[size_t(r)] = B * P.tw_width[size_t(r)];
      }
      const Tensor recv = exchange_rows(output_group_, l, out_split, in_split, "sebc.tw.output");
      int64_t pos = 0;
      for (int j = 0; j < W; ++j) {
        const Tensor block =
            recv.narrow(0, pos, out_split[size_t(j)]).view({B, P.tw_width[size_t(j)]});
        pos += out_split[size_t(j)];
        int64_t c = 0;
        for (const Plan::TwEntry& e : P.tw[size_t(j)]) {
          put_cols(out, P.features[e.feature].out_col + e.col, block.narrow(1, c, e.cols),
                   Tensor());
          c += e.cols;
        }
      }
    }
    if (groups_[kRW]->present) {
      const Tensor l = L[kRW].detach();
      const Tensor in = runtime::zeros({W * Bmax, P.rw_width}, opts);
      for (int r = 0; r < W; ++r)
        if (Bs[size_t(r)] > 0)
          in.narrow(0, r * Bmax, Bs[size_t(r)]).copy_(l.narrow(0, Boff[size_t(r)], Bs[size_t(r)]));
      const Tensor red = reduce_scatter_rows(*output_group_, in, "sebc.rw.reduce_scatter");
      int64_t c = 0;
      for (size_t f : P.rw_features) {
        put_cols(out, P.features[f].out_col, red.narrow(0, 0, B).narrow(1, c, P.features[f].dim),
                 mean_scale[f]);
        c += P.features[f].dim;
      }
    }
    if (groups_[kTWRW]->present) {
      const Tensor l = L[kTWRW].detach();
      const int64_t Dn = P.twrw_width[size_t(node)];
      const Tensor in = runtime::zeros({P.local * Cmax, Dn}, opts);
      for (int lr = 0; lr < P.local; ++lr) {
        int64_t pos = lr * Cmax;
        for (int n = 0; n < P.nodes; ++n) {
          const int r = n * P.local + lr;
          if (Bs[size_t(r)] > 0)
            in.narrow(0, pos, Bs[size_t(r)]).copy_(l.narrow(0, Boff[size_t(r)], Bs[size_t(r)]));
          pos += Bs[size_t(r)];
        }
      }
      const Tensor red = reduce_scatter_rows(mesh_->group(1), in, "sebc.twrw.reduce_scatter");
      std::vector<int64_t> in_split(static_cast<size_t>(P.nodes)),
          out_split(static_cast<size_t>(P.nodes));
      for (int n = 0; n < P.nodes; ++n) {
        in_split[size_t(n)] = Bs[size_t(n * P.local + lrank)] * Dn;
        out_split[size_t(n)] = B * P.twrw_width[size_t(n)];
      }
      const Tensor send = flat(red.narrow(0, 0, C[size_t(lrank)]));
      const Tensor recv =
          exchange_rows(mesh_->group_ptr(0), send, out_split, in_split, "sebc.twrw.output");
      int64_t pos = 0;
      for (int n = 0; n < P.nodes; ++n) {
        const Tensor block =
            recv.narrow(0, pos, out_split[size_t(n)]).view({B, P.twrw_width[size_t(n)]});
        pos += out_split[size_t(n)];
        int64_t c = 0;
        for (size_t f : P.twrw_features[size_t(n)]) {
          put_cols(out, P.features[f].out_col, block.narrow(1, c, P.features[f].dim),
                   mean_scale[f]);
          c += P.features[f].dim;
        }
      }
    }
  }

  // ---- autograd: the output exchange's backward, one node ---------------------------------------
  if (is_training() && runtime::GradMode::enabled()) {
    std::vector<Tensor> inputs{anchor_};
    std::vector<int> input_kind{-1};
    for (int k = 0; k < kKinds; ++k)
      if (L[size_t(k)].defined() && L[size_t(k)].requires_grad()) {
        inputs.push_back(L[size_t(k)]);
        input_kind.push_back(k);
      }
    std::vector<bool> present(kKinds);
    for (int k = 0; k < kKinds; ++k) present[size_t(k)] = groups_[size_t(k)]->present;
    runtime::autograd::record(
        "sharded_embedding_bag_collection", inputs, {out},
        [this, Bs, Boff, B, G, Bmax, C, Cmax, mean_scale, input_kind, present, opts,
         anchor = anchor_](const runtime::autograd::BackwardArgs& args) {
          const Plan& P = *xplan_;
          const int W = P.world, me = P.rank, node = me / P.local, lrank = me % P.local;
          const Tensor g = args.grad(0).contiguous();
          // Output-gradient columns of feature f (scaled for MEAN row-wise features) into dst.
          auto take = [&](const Tensor& dst, int64_t dcol, size_t f, int64_t col, int64_t cols) {
            if (B == 0 || cols == 0) return;
            const Tensor src = g.narrow(1, P.features[f].out_col + col, cols);
            const Tensor d = dst.narrow(0, 0, B).narrow(1, dcol, cols);  // dst may be padded
            if (mean_scale[f].defined())
              d.copy_(runtime::mul(src, mean_scale[f]));
            else
              d.copy_(src);
          };
          std::vector<Tensor> gl(kKinds);
          if (present[kDP]) {
            gl[kDP] = runtime::zeros({B, P.dp_width}, opts);
            int64_t c = 0;
            for (size_t f : P.dp_features) {
              take(gl[kDP], c, f, 0, P.features[f].dim);
              c += P.features[f].dim;
            }
          }
          if (present[kTW]) {
            std::vector<int64_t> in_split(static_cast<size_t>(W)),
                out_split(static_cast<size_t>(W));
            std::vector<Tensor> parts;
            for (int j = 0; j < W; ++j) {
              const Tensor part = runtime::zeros({B, P.tw_width[size_t(j)]}, opts);
              int64_t c = 0;
              for (const Plan::TwEntry& e : P.tw[size_t(j)]) {
                take(part, c, e.feature, e.col, e.cols);
                c += e.cols;
              }
              parts.push_back(flat(part));
              in_split[size_t(j)] = B * P.tw_width[size_t(j)];
              out_split[size_t(j)] = Bs[size_t(j)] * P.tw_width[size_t(me)];
            }
            const Tensor send = parts.empty() ? runtime::zeros({0}, opts) : runtime::cat(parts, 0);
            gl[kTW] =
                exchange_rows(output_group_, send, out_split, in_split, "sebc.tw.output.backward")
                    .view({G, P.tw_width[size_t(me)]});
          }
          if (present[kRW]) {
            const Tensor mine = runtime::zeros({Bmax, P.rw_width}, opts);
            int64_t c = 0;
            for (size_t f : P.rw_features) {
              take(mine, c, f, 0, P.features[f].dim);
              c += P.features[f].dim;
            }
            const Tensor all = all_gather_rows(*output_group_, mine, "sebc.rw.all_gather");
            gl[kRW] = runtime::empty({G, P.rw_width}, opts);
            for (int r = 0; r < W; ++r)
              if (Bs[size_t(r)] > 0)
                gl[kRW]
                    .narrow(0, Boff[size_t(r)], Bs[size_t(r)])
                    .copy_(all.narrow(0, r * Bmax, Bs[size_t(r)]));
          }
          if (present[kTWRW]) {
            const int64_t Dn = P.twrw_width[size_t(node)];
            std::vector<int64_t> in_split(static_cast<size_t>(P.nodes)),
                out_split(static_cast<size_t>(P.nodes));
            std::vector<Tensor> parts;
            for (int n = 0; n < P.nodes; ++n) {
              const Tensor part = runtime::zeros({B, P.twrw_width[size_t(n)]}, opts);
              int64_t c = 0;
              for (size_t f : P.twrw_features[size_t(n)]) {
                take(part, c, f, 0, P.features[f].dim);
                c += P.features[f].dim;
              }
              parts.push_back(flat(part));
              in_split[size_t(n)] = B * P.twrw_width[size_t(n)];
              out_split[size_t(n)] = Bs[size_t(n * P.local + lrank)] * Dn;
            }
            const Tensor recv = exchange_rows(mesh_->group_ptr(0), runtime::cat(parts, 0),
                                              out_split, in_split, "sebc.twrw.output.backward");
            const Tensor padded = runtime::zeros({Cmax, Dn}, opts);
            if (C[size_t(lrank)] > 0 && Dn > 0)
              padded.narrow(0, 0, C[size_t(lrank)]).copy_(recv.view({C[size_t(lrank)], Dn}));
            const Tensor all = all_gather_rows(mesh_->group(1), padded, "sebc.twrw.all_gather");
            gl[kTWRW] = runtime::empty({G, Dn}, opts);
            for (int lr = 0; lr < P.local; ++lr) {
              int64_t pos = lr * Cmax;
              for (int n = 0; n < P.nodes; ++n) {
                const int r = n * P.local + lr;
                if (Bs[size_t(r)] > 0)
                  gl[kTWRW]
                      .narrow(0, Boff[size_t(r)], Bs[size_t(r)])
                      .copy_(all.narrow(0, pos, Bs[size_t(r)]));
                pos += Bs[size_t(r)];
              }
            }
          }
          std::vector<Tensor> grads;
          for (int k : input_kind)
            grads.push_back(k < 0 ? runtime::zeros_like(anchor) : gl[size_t(k)]);
          return grads;
        });
  }
  return KeyedTensor{feature_names_, feature_dims_, out};
}

std::vector<LocalShard> ShardedEmbeddingBagCollection::local_shards() const {
  std::vector<LocalShard> out;
  const int me = group_->rank();
  for (size_t t = 0; t < configs_.size(); ++t) {
    const EmbeddingBagConfig& c = configs_[t];
    const ParameterSharding& p = plan_.at(c.name);
    for (size_t i = 0; i < p.shards.size(); ++i) {
      const ShardMetadata& s = p.shards[i];
      if (s.rank != me || s.num_rows == 0) continue;
      const Group& g = *groups_[size_t(kind_of(p.type))];
      for (size_t j = 0; j < g.table_cfg.size(); ++j) {
        if (g.table_cfg[j] != t || g.alias_of[j] >= 0 || (!g.module[j] && !g.kv[j])) continue;
        out.push_back(LocalShard{c.name,
                                 "embedding_bags." + c.name + ".weight",
                                 p.type,
                                 s,
                                 {c.num_embeddings, c.embedding_dim},
                                 p.type == ShardingType::DataParallel,
                                 g.module[j] ? g.module[j]->weight : Tensor(),
                                 g.kv[j]});
      }
    }
  }
  return out;
}

void ShardedEmbeddingBagCollection::reset_rows(const std::string& table_name,
                                               const std::vector<int64_t>& global_rows,
                                               int64_t step) {
  size_t t = 0;
  while (t < configs_.size() && configs_[t].name != table_name) ++t;
  MT_CHECK(t < configs_.size(), "ShardedEmbeddingBagCollection: reset_rows: no table named '",
           table_name, "'");
  for (const auto& g : groups_)
    for (size_t j = 0; j < g->table_cfg.size(); ++j) {
      if (g->table_cfg[j] != t || g->alias_of[j] >= 0) continue;
      if (g->kv[j]) {
        commit_kv(*g);
        g->kv[j]->reset_rows(global_rows, step);
      } else if (g->module[j]) {
        g->optimizer.zero_rows(size_t(g->opt_index[j]),
                               g->module[j]->reset_rows(global_rows, step));
      }
    }
}

void ShardedEmbeddingBagCollection::set_init_context(const std::string& table_name,
                                                     const runtime::nn::InitContext& ctx) {
  for (const auto& g : groups_)
    for (size_t j = 0; j < g->table_cfg.size(); ++j) {
      if (configs_[g->table_cfg[j]].name != table_name || g->alias_of[j] >= 0) continue;
      if (g->kv[j]) g->kv[j]->set_init(ctx);
      if (g->module[j]) g->module[j]->set_init_context(ctx);
    }
}

runtime::nn::StateDict ShardedEmbeddingBagCollection::optimizer_state_dict() const {
  return merged_optimizer_state(groups_);
}

void ShardedEmbeddingBagCollection::load_optimizer_state_dict(const runtime::nn::StateDict& state) {
  load_optimizer_state_by_group(groups_, state, "ShardedEmbeddingBagCollection", group_->rank());
}

void ShardedEmbeddingBagCollection::set_lr(double lr) { set_groups_lr(groups_, lr); }

std::vector<ShardedEmbeddingBagCollection::ShardGrad> ShardedEmbeddingBagCollection::sparse_grads()
    const {
  std::vector<ShardGrad> out;
  for (const auto& g : groups_)
    for (const RowSparseGrad& r : g->sparse_grads) {
      const size_t lt = g->opt_lookup.at(size_t(r.table));
      out.push_back({"embedding_bags." + configs_[g->table_cfg[lt]].name + ".weight", r});
    }
  return out;
}

double ShardedEmbeddingBagCollection::sparse_grad_norm_pow(double norm_type) const {
  return groups_sparse_norm_pow(groups_, norm_type, [&](size_t k) {
    return groups_[k]->kind != kDP || group_->rank() == 0;  // replicas count once
  });
}

void ShardedEmbeddingBagCollection::scale_sparse_grads_(double coef) {
  scale_groups_sparse_grads(groups_, coef);
}

void ShardedEmbeddingBagCollection::zero_sparse_grads() { zero_groups_sparse_grads(groups_); }

}  // namespace mt::parallel
