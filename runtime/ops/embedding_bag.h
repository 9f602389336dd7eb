// Table-batched embedding lookups (FBGEMM's "TBE" idea): ONE call looks up every feature of a
// KeyedJaggedTensor-shaped batch in its table, for any number of tables, as one parallel loop over
// (feature, sample) bags, instead of one embedding op per table.
//
// Inputs (the KJT layout, see runtime/sparse/keyed_jagged_tensor.h): F features, batch B,
//   values  i64 [N]         ids of feature 0 (sample 0, 1, ...), then feature 1, ...
//   offsets i64 [F * B + 1] bag (f, b) holds values[offsets[f*B + b] .. offsets[f*B + b + 1])
//   tables  [rows_t, dim_t] one tensor per table (one floating dtype for all; f32 and f64 tested,
//                           16-bit tables accumulate in f32). Feature f reads table
//                           layout.feature_table[f]; several features may share a table.
// Ids are table-local row indices in [0, rows_t): a sharded table (a row range or a column range
// of a global table, parallel/) passes its local shard and ids already made local; an id out of
// range throws naming the feature, sample, id and table size.
//
// Pooled (embedding_bags_batched): out [B, sum_f dim_{t(f)}], feature f's pooled row in columns
// [col_f, col_f + dim) in feature order (the KeyedTensor layout). SUM: sum_i w_i * row(id_i);
// MEAN: that sum divided by the bag's length (an empty bag gives 0). w_i = per_sample_weights[i]
// or 1.
// Unpooled (embedding_lookup_batched): a flat out [sum_f n_f * dim_{t(f)}]: feature f's n_f rows
// [n_f, dim] one after another (its block starts at sum_{g<f} n_g * dim_g).
//
// Backward. For each table, the gradient restricted to the rows the batch touched: a RowSparseGrad
// (sorted unique rows, and per row the sum of its contributions, added in increasing value
// position: deterministic, independent of the thread count). Where it goes:
// - sink == nullptr: tables that require grad get their usual dense [rows, dim] gradient through
//   autograd (index_add of the row-sparse one into zeros): plain training, data-parallel tables.
// - sink given: tables are NOT autograd inputs (they need not require grad); the output requires
//   grad whenever grad mode is on, and backward calls sink(grads) exactly once, with one
//   RowSparseGrad per table the batch touched (ascending table index; tables no id touched are
//   absent). A fused optimizer (runtime/sparse/fused_optimizer.h) updates the
//   rows there (no dense gradient is ever made), or the module keeps the row-sparse gradient for a
//   later step and for clipping. The sink runs during backward: it may modify the tables in place
//   (the forward saved no table data).
// per_sample_weights are not differentiated.
//
// Devices: all tables on one device (CPU or CUDA); the output, the gradients and RowSparseGrad's
// rows and values live there. values/offsets/weights may be on any device: the op validates them
// on a host copy (offsets shape the work) and hands the kernels copies on the tables' device.
// Kernels: runtime/cpu/embedding_bag.cpp and runtime/cuda/embedding_bag.cu (one host sync per
// CUDA forward for the id check; the CUDA backward groups ids on the host).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime {

enum class PoolingMode : int8_t { Sum, Mean };
const char* pooling_name(PoolingMode mode);  // "SUM", "MEAN"

// Which table each feature reads and how it pools (host metadata of one batched lookup).
struct TableBatchLayout {
  std::vector<int64_t> feature_table;        // [F]: table index of each feature
  std::vector<PoolingMode> feature_pooling;  // [F] (pooled lookups; empty means all SUM)
  std::vector<std::string> feature_names;    // [F] or empty: used in error messages only
};

// The gradient of one table restricted to the rows a batch touched.
struct RowSparseGrad {
  int64_t table = -1;    // index into the tables of the lookup
  Tensor rows;           // i64 [U], strictly increasing
  Tensor values;         // [U, dim], the table's dtype
  int64_t num_rows = 0;  // the table's row count (for densifying)
  // The dense [num_rows, dim] gradient (zeros outside `rows`).
  Tensor to_dense() const;
};

using TableGradSink = std::function<void(std::vector<RowSparseGrad>& grads)>;

// See above. values/offsets: i64 (i32 accepted), 1-D; per_sample_weights: [N] floating or
// undefined.
Tensor embedding_bags_batched(const std::vector<Tensor>& tables, const Tensor& values,
                              const Tensor& offsets, int64_t batch_size,
                              const TableBatchLayout& layout,
                              const Tensor& per_sample_weights = Tensor(),
                              const TableGradSink& sink = nullptr);

Tensor embedding_lookup_batched(const std::vector<Tensor>& tables, const Tensor& values,
                                const Tensor& offsets, int64_t batch_size,
                                const TableBatchLayout& layout,
                                const TableGradSink& sink = nullptr);

}  // namespace mt::runtime
