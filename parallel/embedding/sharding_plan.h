// How the embedding tables of a collection are spread over the ranks (TorchRec's ShardingPlan /
// ParameterSharding): one sharding type per table and, per shard, where it lives in the global
// [num_embeddings, embedding_dim] table and which rank holds it.
//
// Sharding types (TorchRec's names and communication patterns, see
// sharded_embedding_bag_collection.h):
//   data_parallel   the whole table on every rank (gradients all-reduced); shards: one per rank
//   table_wise      the whole table on one rank; shards: one
//   column_wise     the columns split into shards, each on a different rank (a table_wise table of
//                   a narrower width); shards: one per column range, ranks distinct
//   row_wise        the rows split into contiguous blocks over every rank of the group, block r on
//                   rank r (TorchRec's ceil(rows / world) blocks; the last blocks may be empty)
//   table_row_wise  row_wise over the ranks of one node of a (node, local) mesh: block l on rank
//                   node * local_size + l
// Shards are in global coordinates (row_offset, col_offset, num_rows, num_cols): exactly what a
// checkpoint needs to save them as global tables and reshard on load.
//
// Memory estimates (shard_bytes) count the weights and the fused row optimizer's state
// (runtime/sparse/fused_optimizer.h: f32 state, f64 for f64 tables): SGD none, row-wise Adagrad one
// value per row, Adam two per element, partial row-wise Adam one per element plus one per row.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/sparse/embedding_config.h"

namespace mt::parallel {

using runtime::sparse::EmbeddingBagConfig;

enum class ShardingType { DataParallel, TableWise, RowWise, ColumnWise, TableRowWise };
// "data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise"
const char* sharding_type_name(ShardingType type);
// Parses those names (case-insensitive); throws naming the accepted values.
ShardingType parse_sharding_type(const std::string& name);

// One shard: a block of the global table and the rank that holds it.
struct ShardMetadata {
  int64_t row_offset = 0, num_rows = 0;
  int64_t col_offset = 0, num_cols = 0;
  int rank = 0;
};

// The sharding of one table.
struct ParameterSharding {
  ShardingType type = ShardingType::TableWise;
  std::vector<int> ranks;             // the ranks holding a shard, in shard order
  std::vector<ShardMetadata> shards;  // see the table above for each type
  std::string reason;                 // why the planner chose it (empty for hand-made plans)
};

// Builders for the standard layouts (the planner uses them; so can hand-written plans).
ParameterSharding data_parallel_sharding(const EmbeddingBagConfig& table, int world_size);
ParameterSharding table_wise_sharding(const EmbeddingBagConfig& table, int rank);
// Columns split into ranks.size() ranges as even as possible (the first ones one wider).
ParameterSharding column_wise_sharding(const EmbeddingBagConfig& table, std::vector<int> ranks);
ParameterSharding row_wise_sharding(const EmbeddingBagConfig& table, int world_size);
ParameterSharding table_row_wise_sharding(const EmbeddingBagConfig& table, int node,
                                          int local_size);

// Bytes of a [rows, cols] shard of `table`: weights in `dtype` plus the optimizer state (a kv
// table's: those of its cache's rows).
int64_t shard_bytes(const EmbeddingBagConfig& table, int64_t rows, int64_t cols,
                    runtime::DType dtype = runtime::DType::F32);

struct ShardingPlan {
  int world_size = 1;
  int local_size = 0;  // ranks per node (table_row_wise); 0 means world_size (one node)
  std::map<std::string, ParameterSharding> tables;  // by table name

  int ranks_per_node() const { return local_size > 0 ? local_size : world_size; }
  // The sharding of `table`; throws naming the table and the tables planned.
  const ParameterSharding& at(const std::string& table) const;

  // Checks that every table of `tables` (and no other) is planned and that its shards tile the
  // table as its type requires, with valid ranks; errors name the table and what is wrong.
  void validate(const std::vector<EmbeddingBagConfig>& tables) const;

  // Bytes each rank holds (weights + optimizer state), [world_size].
  std::vector<int64_t> bytes_per_rank(const std::vector<EmbeddingBagConfig>& tables,
                                      runtime::DType dtype = runtime::DType::F32) const;

  // The plan as a text table, one line per table in `tables` order:
  //   table | type | ranks | shards (rows x cols @ row,col) | bytes per rank | why
  // then the total bytes per rank.
  std::string describe(const std::vector<EmbeddingBagConfig>& tables,
                       runtime::DType dtype = runtime::DType::F32) const;
};

}  // namespace mt::parallel
