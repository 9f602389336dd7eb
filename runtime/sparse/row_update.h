// RowUpdate: the rows of one table a training step changed, with their new values, as a
// collection reports them to a listener (e.g. the stream to a serving replica,
// parallel/embedding/row_stream.h). Rows are GLOBAL row ids of the table; a column shard reports
// its columns [col_offset, col_offset + values.size(1)) of them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime::sparse {

struct RowUpdate {
  std::string table;          // the table's name
  int64_t step = 0;           // the optimizer step that produced the values (1-based)
  int64_t embedding_dim = 0;  // the table's global width
  int64_t col_offset = 0;     // first column of `values` in the table
  std::vector<int64_t> rows;  // global row ids, sorted, unique
  Tensor values;              // [rows.size(), cols] on the host, f32 or f64 (a copy)
  // The rows' optimizer state when asked for ("momentum1" [n, w], ...), host copies.
  std::vector<std::pair<std::string, Tensor>> state;
};

// Called on the training thread after every step that updated rows (may be a no-op); it must
// not block on the network (queue and return).
using RowUpdateListener = std::function<void(std::vector<RowUpdate>&& updates)>;

}  // namespace mt::runtime::sparse
