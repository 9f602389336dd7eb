// The row optimizers of a collection's tables (FBGEMM's fused "exact" optimizers): one step takes
// the row-sparse gradients of a batch (duplicate ids already summed, one update per touched row;
// rows no id touched are left alone, their state too) and updates the rows in place. Collections
// call it inside backward (GradientMode::Fused: no dense gradient exists) or when their kept
// row-sparse gradients are applied (GradientMode::RowSparse).
//
// State (FBGEMM's names), f32 (f64 for f64 tables), indexed by the table's local row:
//   SGD                 none
//   RowwiseAdagrad      momentum1 [rows, 1]  (sum of the mean squared row gradients)
//   Adam                momentum1 [rows, dim], momentum2 [rows, dim]
//   PartialRowwiseAdam  momentum1 [rows, dim], momentum2 [rows, 1]
// plus a step count per table: the number of optimizer steps taken (every step counts for every
// table, touched or not, as FBGEMM's iteration counter; the Adams' bias corrections use it).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/nn/state_dict.h"
#include "runtime/sparse/embedding_config.h"

namespace mt::runtime::sparse {

// The per-row state fields of an optimizer for rows of width `dim`: (name, width) in order
// (momentum1, then momentum2), as listed above.
std::vector<std::pair<std::string, int64_t>> row_state_fields(EmbOptimType type, int64_t dim);

class FusedEmbeddingOptimizer {
 public:
  FusedEmbeddingOptimizer() = default;
  // One entry per table: its settings, local shape [rows, dim], dtype, and the key its state is
  // saved under (the weight's FQN, e.g. "embedding_bags.t1.weight").
  void add_table(const EmbeddingOptimizerConfig& config, int64_t rows, int64_t dim, DType dtype,
                 std::string key);
  size_t num_tables() const { return tables_.size(); }

  // One step: updates weights[g.table] at g.rows for every g (no_grad; bumps the versions).
  void step(const std::vector<Tensor>& weights, const std::vector<RowSparseGrad>& grads);

  const EmbeddingOptimizerConfig& config(size_t table) const { return tables_.at(table).config; }
  void set_lr(double lr);  // every table
  void set_lr(size_t table, double lr);
  int64_t step_count(size_t table) const { return tables_.at(table).step; }
  // Named state tensors of one table ("momentum1", "momentum2"), the optimizer's own tensors.
  std::vector<std::pair<std::string, Tensor>> table_state(size_t table) const;
  // For a kv-backed table (kv/kv_table.h): the next steps update a working set of `rows` rows
  // whose state is `momentum1` / `momentum2` (shaped as row_state_fields says; updated in place).
  void bind_rows(size_t table, int64_t rows, Tensor momentum1, Tensor momentum2);
  // The table's state lives elsewhere (a kv table's store): state_dict, load_state_dict,
  // table_state and zero_rows then cover only its step count.
  void set_external_state(size_t table) { tables_.at(table).external = true; }
  // Zeroes the state of local rows `rows` of one table (evicted ids start over): one write per
  // state tensor, wherever it lives (no_grad).
  void zero_rows(size_t table, const std::vector<int64_t>& rows) const;

  // "<key>.momentum1", "<key>.momentum2" (as present) and "<key>.step" (0-D i64) per table.
  nn::StateDict state_dict() const;
  // Checks every key, shape and dtype first (all problems in one message), then copies.
  void load_state_dict(const nn::StateDict& state);

 private:
  struct Table {
    EmbeddingOptimizerConfig config;
    int64_t rows = 0, dim = 0;
    std::string key;
    int64_t step = 0;
    bool external = false;
    Tensor momentum1, momentum2;
  };
  std::vector<Table> tables_;
};

}  // namespace mt::runtime::sparse
