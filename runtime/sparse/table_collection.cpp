#include "runtime/sparse/table_collection.h"

#include <cmath>
#include <set>

#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"
#include "runtime/sparse/row_sparse_grad.h"

namespace mt::runtime::sparse {

namespace {

EmbeddingBagConfig resolved(EmbeddingBagConfig c, const char* where) {
  MT_CHECK(!c.name.empty() && c.name.find('.') == std::string::npos, where,
           ": table names must be non-empty and contain no '.', got '", c.name, "'");
  MT_CHECK(c.num_embeddings > 0 && c.embedding_dim > 0, where, ": table '", c.name,
           "' needs positive num_embeddings and embedding_dim, got ", c.num_embeddings, " x ",
           c.embedding_dim);
  MT_CHECK(!c.feature_names.empty(), where, ": table '", c.name, "' has no feature_names");
  MT_CHECK(!c.raw_ids || c.storage == TableStorage::Kv, where, ": table '", c.name,
           "' keys raw ids (raw_ids) but is not kv-backed: only kv tables (storage = kv) hold "
           "rows for arbitrary ids");
  TableShard& s = c.shard;
  if (s.num_rows < 0) s.num_rows = c.num_embeddings - s.row_offset;
  if (s.num_cols < 0) s.num_cols = c.embedding_dim - s.col_offset;
  MT_CHECK(s.row_offset >= 0 && s.num_rows >= 0 && s.row_offset + s.num_rows <= c.num_embeddings &&
               s.col_offset >= 0 && s.num_cols > 0 && s.col_offset + s.num_cols <= c.embedding_dim,
           where, ": table '", c.name, "': shard rows [", s.row_offset, ", +", s.num_rows,
           ") cols [", s.col_offset, ", +", s.num_cols, ") do not fit the table [",
           c.num_embeddings, ", ", c.embedding_dim, "]");
  return c;
}

}  // namespace

EmbeddingTable::EmbeddingTable(std::string type_name, const EmbeddingBagConfig& config, DType dtype,
                               bool requires_grad)
    : Module(std::move(type_name)),
      config_(config),
      rows_(config.shard.num_rows),
      cols_(config.shard.num_cols) {
  MT_CHECK(is_floating(dtype), this->type_name(), ": expected a floating dtype, got ", dtype);
  weight = empty({config.storage == TableStorage::Kv ? 0 : rows_, cols_},
                 TensorOptions{}.with_dtype(dtype));
  register_parameter("weight", weight, requires_grad);
  reset_parameters(nn::InitContext{});
}

std::pair<double, double> init_bounds(const EmbeddingBagConfig& c) {
  const double bound = std::sqrt(1.0 / double(c.num_embeddings));
  return {std::isnan(c.weight_init_min) ? -bound : c.weight_init_min,
          std::isnan(c.weight_init_max) ? bound : c.weight_init_max};
}

int64_t raw_id_owner(int64_t id, int64_t parts) {
  // splitmix64's finalizer, offset so that it differs from the managed-collision bucket hash and
  // the row cache's set hash (owner and set stay independent).
  uint64_t z = uint64_t(id) + 0x6A09E667F3BCC909ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return int64_t((z ^ (z >> 31)) % uint64_t(parts));
}

int64_t KvCacheSize::rows_for(int64_t shard_rows) const {
  if (rows > 0) return std::max<int64_t>(1, std::min(rows, shard_rows));
  return std::max<int64_t>(1, int64_t(fraction * double(shard_rows)));
}

const char* table_storage_name(TableStorage storage) {
  return storage == TableStorage::Kv ? "kv" : "memory";
}

TableStorage parse_table_storage(const std::string& name) {
  if (name == "memory") return TableStorage::Memory;
  if (name == "kv") return TableStorage::Kv;
  MT_FAIL("embedding table storage: unknown value '", name, "' (expected memory or kv)");
}

const char* table_update_name(TableUpdate update) {
  switch (update) {
    case TableUpdate::Train:
      return "train";
    case TableUpdate::Frozen:
      return "frozen";
    case TableUpdate::Writeback:
      return "writeback";
  }
  return "?";
}

TableUpdate parse_table_update(const std::string& name) {
  if (name == "train") return TableUpdate::Train;
  if (name == "frozen") return TableUpdate::Frozen;
  if (name == "writeback") return TableUpdate::Writeback;
  MT_FAIL("embedding table update: unknown value '", name,
          "' (expected train, frozen or writeback)");
}

void EmbeddingTable::reset_parameters(const nn::InitContext& ctx) {
  init_ = ctx;
  if (weight.size(0) == 0) return;
  const auto [lo, hi] = init_bounds(config_);
  nn::init_uniform_(weight, ctx.key("weight"), lo, hi,
                    {config_.num_embeddings, config_.embedding_dim},
                    {config_.shard.row_offset, config_.shard.col_offset});
}

std::vector<int64_t> EmbeddingTable::reset_rows(const std::vector<int64_t>& global_rows,
                                                int64_t step) {
  const auto [lo, hi] = init_bounds(config_);
  const RandomKey key = init_.key("weight.reset").with_offset(uint64_t(step));
  NoGradGuard no_grad;
  std::vector<int64_t> local, global;
  for (int64_t row : global_rows) {
    MT_CHECK(row >= 0 && row < config_.num_embeddings, "EmbeddingTable '", config_.name,
             "': reset_rows: row ", row, " is outside the table's ", config_.num_embeddings,
             " rows");
    const int64_t r = row - config_.shard.row_offset;
    if (r < 0 || r >= rows_) continue;
    local.push_back(r);
    global.push_back(row);
  }
  if (local.empty()) return local;
  // Drawn on the host row by row (each keyed by its global row), written in one go.
  const int64_t n = int64_t(local.size());
  const Tensor fresh = empty({n, cols_}, TensorOptions{}.with_dtype(weight.dtype()));
  for (int64_t i = 0; i < n; ++i) {
    nn::init_uniform_(fresh.narrow(0, i, 1), key, lo, hi,
                      {config_.num_embeddings, config_.embedding_dim},
                      {global[size_t(i)], config_.shard.col_offset});
  }
  const TensorOptions on = TensorOptions{}.with_dtype(DType::I64).with_device(weight.device());
  index_copy_(weight, 0, from_vector<int64_t>(local, {n}, on), fresh.to(weight.device(), true));
  return local;
}

TableCollection::TableCollection(std::string type_name, const std::string& container,
                                 const char* table_type, std::vector<EmbeddingBagConfig> configs,
                                 CollectionOptions options)
    : Module(type_name), options_(options), container_(container) {
  auto holder = register_module(container, std::make_shared<nn::Module>("ModuleDict"));
  std::set<std::string> names, features;
  for (size_t t = 0; t < configs.size(); ++t) {
    EmbeddingBagConfig c = resolved(configs[t], type_name.c_str());
    MT_CHECK(names.insert(c.name).second, type_name, ": two tables are named '", c.name, "'");
    for (const std::string& f : c.feature_names) {
      MT_CHECK(features.insert(f).second, type_name, ": feature '", f,
               "' is listed by more than one table (or twice)");
      layout_.feature_names.push_back(f);
      layout_.feature_table.push_back(int64_t(t));
      layout_.feature_pooling.push_back(c.pooling);
    }
    auto table = holder->register_module(
        c.name, std::make_shared<EmbeddingTable>(table_type, c, options.dtype,
                                                 options.gradient_mode == GradientMode::Dense));
    tables_.push_back(table);
    configs_.push_back(c);
    optimizer_.add_table(c.optimizer, table->local_rows(), table->local_cols(), options.dtype,
                         weight_fqn(t));
  }
  if (options_.device != Device::cpu()) to(options_.device);
}

std::vector<Tensor> TableCollection::weights() const {
  std::vector<Tensor> out;
  for (const auto& t : tables_) out.push_back(t->weight);
  return out;
}

std::string TableCollection::weight_fqn(size_t table) const {
  return container_ + "." + configs_.at(table).name + ".weight";
}

void TableCollection::apply_sparse_grads() {
  optimizer_.step(weights(), sparse_grads_);
  sparse_grads_.clear();
}

void TableCollection::reset_rows(const std::string& table_name,
                                 const std::vector<int64_t>& global_rows, int64_t step) {
  size_t t = 0;
  while (t < configs_.size() && configs_[t].name != table_name) ++t;
  MT_CHECK(t < configs_.size(), type_name(), ": reset_rows: no table named '", table_name, "'");
  optimizer_.zero_rows(t, tables_[t]->reset_rows(global_rows, step));
}

KeyedJaggedTensor TableCollection::arrange(const KeyedJaggedTensor& features) const {
  for (const EmbeddingBagConfig& c : configs_)
    MT_CHECK(c.storage == TableStorage::Memory, type_name(), ": table '", c.name,
             "' is kv-backed; kv tables are looked up through parallel::"
             "ShardedEmbeddingBagCollection (one process too)");
  features.validate();
  KeyedJaggedTensor kjt = features.keys() == layout_.feature_names
                              ? features
                              : features.select_keys(layout_.feature_names);
  for (size_t f = 0; f < layout_.feature_names.size(); ++f) {
    const int64_t t = layout_.feature_table[f];
    kjt.validate_ids(layout_.feature_names[f], tables_[t]->local_rows(), configs_[t].name);
  }
  return kjt;
}

TableGradSink TableCollection::make_sink() {
  if (options_.gradient_mode == GradientMode::Dense || !is_training()) return nullptr;
  if (options_.gradient_mode == GradientMode::Fused)
    return [this](std::vector<RowSparseGrad>& grads) { optimizer_.step(weights(), grads); };
  return [this](std::vector<RowSparseGrad>& grads) { accumulate(sparse_grads_, grads); };
}

}  // namespace mt::runtime::sparse
