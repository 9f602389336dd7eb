// TableCollection: what EmbeddingBagCollection and EmbeddingCollection share: the tables (one
// child module per table holding `weight`, named like TorchRec: "<container>.<table>.weight"),
// the features in output order, the batched-lookup layout, the fused row optimizer, and the
// gradient mode (embedding_config.h):
//   Fused      backward runs the tables' optimizer on the touched rows (training mode only); the
//              weights do not require grad and are left out of dense optimizers and of clipping
//              (TorchRec does the same).
//   RowSparse  backward accumulates a RowSparseGrad per touched table (sparse_grads()); the
//              training loop clips them with the dense gradients (row_sparse_grad.h) and calls
//              apply_sparse_grads(), which steps the same row optimizers and drops them.
//   Dense      weights require grad; autograd gives them dense [rows, dim] gradients (for a
//              regular optimizer, e.g. data-parallel replicated tables).
//
// Init: uniform(-sqrt(1/num_embeddings), +sqrt(1/num_embeddings)) like TorchRec (or the config's
// bounds), keyed by (seed, weight FQN) over the global table shape, so a shard (config.shard)
// holds exactly the unsharded table's values. The constructor uses seed 0; init_weights(seed) on
// the root module redraws with the root's FQNs.
//
// Features: every feature name appears in exactly one table; the output lists the features table
// by table, in each table's feature_names order. An input KJT must hold every feature (extra
// keys are ignored; it is permuted when its key order differs) and is validated (lengths, ids
// against each table's local rows) with errors naming feature, sample and table.
//
// Modules capture `this` in the backward they record: a collection must outlive its graphs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/nn/module.h"
#include "runtime/sparse/embedding_config.h"
#include "runtime/sparse/fused_optimizer.h"
#include "runtime/sparse/keyed_jagged_tensor.h"
#include "runtime/sparse/kv/row_cache.h"

namespace mt::runtime::sparse {

// Kv-backed tables (EmbeddingBagConfig::storage = Kv; kv/kv_table.h): where and how they keep
// their rows.
// (Each table's cache size is its config's kv_cache.)
struct KvSettings {
  std::string path;  // root folder; each rank's store is <path>/rank-<r> (wiped at start)
  CachePolicy policy = CachePolicy::LRU;
  // The caches' rows in a tensor on the tables' device: always on a GPU (device memory); on the
  // CPU for tests of that layout (kv/kv_table.h).
  bool tensor_cache = false;
};

struct CollectionOptions {
  GradientMode gradient_mode = GradientMode::Fused;
  DType dtype = DType::F32;  // table dtype (f32; f64 for tests)
  bool is_weighted = false;  // pooled only: use the KJT's per-value weights
  // Where the tables are made (initialised on the host, then moved) and where the outputs are.
  // Input KJTs stay on the host: ids are checked and routed there. Module::to moves the tables
  // of an unsharded collection later (this field keeps its construction value).
  Device device = Device::cpu();
  KvSettings kv;
};

// One table: a module holding `weight` [local rows, local cols].
class EmbeddingTable : public nn::Module {
 public:
  EmbeddingTable(std::string type_name, const EmbeddingBagConfig& config, DType dtype,
                 bool requires_grad);
  void reset_parameters(const nn::InitContext& ctx) override;
  // Redraws the rows of `global_rows` that this shard holds (all its columns) from the init
  // distribution, keyed by (the last init's seed and FQN, "reset", step) over the global shape:
  // the same values for any sharding. Returns the local rows it reset (no_grad; bumps versions).
  std::vector<int64_t> reset_rows(const std::vector<int64_t>& global_rows, int64_t step);
  const EmbeddingBagConfig& config() const { return config_; }
  int64_t local_rows() const { return rows_; }
  int64_t local_cols() const { return cols_; }
  // The context of the last reset_parameters (seed, FQN): a kv-backed shard draws its rows from
  // it as this table would.
  const nn::InitContext& init_context() const { return init_; }
  // The context reset_rows draws from, without redrawing the rows (a shard whose values were
  // copied from the whole table takes that table's context).
  void set_init_context(const nn::InitContext& ctx) { init_ = ctx; }
  // A kv-backed table (config.storage) holds no rows here: weight is [0, cols].
  Tensor weight;

 private:
  EmbeddingBagConfig config_;
  int64_t rows_, cols_;
  nn::InitContext init_;  // of the last reset_parameters
};

class TableCollection : public nn::Module {
 public:
  const std::vector<EmbeddingBagConfig>& table_configs() const { return configs_; }
  size_t num_tables() const { return configs_.size(); }
  // Features in output order, and the table each reads.
  const std::vector<std::string>& feature_names() const { return layout_.feature_names; }
  const TableBatchLayout& layout() const { return layout_; }
  // The tables' current weights (the tensors in the slots), in config order.
  std::vector<Tensor> weights() const;
  const EmbeddingTable& table(size_t t) const { return *tables_.at(t); }
  // "<container>.<table>.weight", relative to this module.
  std::string weight_fqn(size_t table) const;
  GradientMode gradient_mode() const { return options_.gradient_mode; }
  const CollectionOptions& options() const { return options_; }

  FusedEmbeddingOptimizer& fused_optimizer() { return optimizer_; }
  const FusedEmbeddingOptimizer& fused_optimizer() const { return optimizer_; }
  // The row optimizers' state keyed "<weight fqn>.momentum1" etc. (relative to this module).
  nn::StateDict optimizer_state_dict() const { return optimizer_.state_dict(); }
  void load_optimizer_state_dict(const nn::StateDict& state) { optimizer_.load_state_dict(state); }

  // GradientMode::RowSparse: the gradients kept since the last apply/zero (sorted by table).
  const std::vector<RowSparseGrad>& sparse_grads() const { return sparse_grads_; }
  std::vector<RowSparseGrad>& mutable_sparse_grads() { return sparse_grads_; }
  // One optimizer step with the kept gradients (a step even when none are kept), then drops them.
  void apply_sparse_grads();
  void zero_sparse_grads() { sparse_grads_.clear(); }

  // Managed-collision evictions (managed_collision.h): re-initialises `global_rows` of table
  // `table_name` (EmbeddingTable::reset_rows, keyed by the init_weights seed, the FQN, the row
  // and `step`) and zeroes their fused optimizer state (the step count is left alone).
  void reset_rows(const std::string& table_name, const std::vector<int64_t>& global_rows,
                  int64_t step);

  // Validates `features` and returns the KJT of exactly feature_names(), in that order.
  KeyedJaggedTensor arrange(const KeyedJaggedTensor& features) const;

 protected:
  TableCollection(std::string type_name, const std::string& container, const char* table_type,
                  std::vector<EmbeddingBagConfig> configs, CollectionOptions options);
  // The sink the lookup gets: nullptr in Dense mode or outside training.
  TableGradSink make_sink();

 private:
  std::vector<EmbeddingBagConfig> configs_;
  CollectionOptions options_;
  std::string container_;
  std::vector<std::shared_ptr<EmbeddingTable>> tables_;
  TableBatchLayout layout_;
  FusedEmbeddingOptimizer optimizer_;
  std::vector<RowSparseGrad> sparse_grads_;
};

}  // namespace mt::runtime::sparse
