// Table configurations of the embedding collections (TorchRec's EmbeddingBagConfig /
// EmbeddingConfig), the fused optimizer settings of a table, and how a table's gradient is
// handled (GradientMode).
//
// A table may be a shard of a global table (TableShard): a row range and/or a column range of the
// global [num_embeddings, embedding_dim] table. The local weight is then [rows, cols], initialised
// with exactly the values the unsharded table holds there (the draw is keyed by (seed, FQN) over
// the global shape), ids given to it must already be local rows, and its optimizer state is
// indexed by local row (global row = row_offset + local row). Row-wise optimizer state of a
// column shard averages over the shard's columns only (as TorchRec's column-wise sharding does).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/embedding_optim.h"
#include "runtime/ops/embedding_bag.h"

namespace mt::runtime::sparse {

// FBGEMM's optimizer names: EXACT_SGD, EXACT_ROWWISE_ADAGRAD, ADAM, PARTIAL_ROWWISE_ADAM.
using EmbOptimType = RowOptimizer;
const char* optimizer_name(EmbOptimType type);
// Parses "sgd" / "exact_sgd", "rowwise_adagrad" / "exact_rowwise_adagrad", "adam",
// "partial_rowwise_adam" (case-insensitive); throws naming the accepted values.
EmbOptimType parse_optimizer(const std::string& name);

struct EmbeddingOptimizerConfig {
  EmbOptimType type = EmbOptimType::RowwiseAdagrad;
  double lr = 0.01;
  double eps = 1e-8;
  double beta1 = 0.9, beta2 = 0.999;  // Adam, PartialRowwiseAdam
  double weight_decay = 0.0;          // L2 for SGD/Adagrad, decoupled for the Adams
};

// How backward treats the tables of a collection.
enum class GradientMode {
  Fused,      // the optimizer updates the touched rows inside backward; no gradient is kept
  RowSparse,  // backward keeps a row-sparse gradient per table (stepped / clipped later)
  Dense,      // weights require grad and get dense [rows, dim] .grad through autograd
};

// Where a table's rows live: in a tensor (memory), or in a RocksDB store behind a row cache
// (kv: kv/kv_table.h; the sharded collection's tables only).
enum class TableStorage { Memory, Kv };
const char* table_storage_name(TableStorage storage);      // "memory", "kv"
TableStorage parse_table_storage(const std::string& name);  // throws naming the values

// How a step changes a table's rows (FBGEMM / TorchRec):
//   Train      the fused row optimizer applies the gradients
//   Frozen     looked up only: no gradient, no optimizer state, rows never change
//   Writeback  the gradient that reaches a row IS its new value (direct assignment in backward:
//              the sum of the row's gradient rows in the batch; hit each row once to assign it)
enum class TableUpdate { Train, Frozen, Writeback };
const char* table_update_name(TableUpdate update);      // "train", "frozen", "writeback"
TableUpdate parse_table_update(const std::string& name);  // throws naming the values

// How many of a kv table shard's rows its cache holds: `rows` when > 0 (at most the shard's),
// else `fraction` of them (at least one).
struct KvCacheSize {
  int64_t rows = 0;
  double fraction = 0.1;
  int64_t rows_for(int64_t shard_rows) const;
};

// The part of a global table a module holds (defaults: all of it).
struct TableShard {
  int64_t row_offset = 0, num_rows = -1;  // -1: up to the end
  int64_t col_offset = 0, num_cols = -1;
};

struct EmbeddingBagConfig {
  std::string name;
  int64_t num_embeddings = 0;  // global rows
  int64_t embedding_dim = 0;   // global columns
  std::vector<std::string> feature_names;
  PoolingMode pooling = PoolingMode::Sum;
  EmbeddingOptimizerConfig optimizer;
  // Init: uniform(weight_init_min, weight_init_max); NaN means -+sqrt(1 / num_embeddings).
  double weight_init_min = std::numeric_limits<double>::quiet_NaN();
  double weight_init_max = std::numeric_limits<double>::quiet_NaN();
  TableShard shard;
  TableStorage storage = TableStorage::Memory;
  KvCacheSize kv_cache;  // kv tables: the cache of each shard (what they keep in memory)
  TableUpdate update = TableUpdate::Train;
  // A table read by several features: only the gradients of these features update its rows
  // (the others only read them). Empty: every feature's.
  std::vector<std::string> update_features;
  // Kv tables only: the ids are raw 64-bit keys (any id in [0, 2^63 - 1), e.g. hashed feature
  // values), not rows 0..num_embeddings-1: a row exists for every id the table has seen, with no
  // fixed count. num_embeddings is then the rows the table is expected to hold (the default init
  // bounds, cache_fraction and the planner count it). Id i starts with the value the in-memory
  // table holds at row i (ids past num_embeddings continue the same keyed stream). Sharding that
  // splits rows (row_wise, table_row_wise) gives id i to shard raw_id_owner(i, shards).
  bool raw_ids = false;
};

// The shard (0..parts-1) that keeps raw id `id` of a raw-id table split into `parts` (a hash, so
// any id range spreads evenly; the same on every machine).
int64_t raw_id_owner(int64_t id, int64_t parts);

// The init distribution's bounds: the config's, or -+sqrt(1 / num_embeddings).
std::pair<double, double> init_bounds(const EmbeddingBagConfig& config);

// Unpooled tables (EmbeddingCollection): the same fields; pooling is unused.
using EmbeddingConfig = EmbeddingBagConfig;

}  // namespace mt::runtime::sparse
