#include "parallel/embedding/sharding_plan.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>
#include <sstream>

#include "runtime/core/error.h"

namespace mt::parallel {

namespace {

constexpr const char* kTypeNames[] = {"data_parallel", "table_wise", "row_wise", "column_wise",
                                      "table_row_wise"};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string format_bytes(int64_t b) {
  char buf[32];
  if (b >= (int64_t(1) << 30))
    std::snprintf(buf, sizeof(buf), "%.2f GiB", double(b) / (1 << 30));
  else if (b >= (int64_t(1) << 20))
    std::snprintf(buf, sizeof(buf), "%.2f MiB", double(b) / (1 << 20));
  else if (b >= (int64_t(1) << 10))
    std::snprintf(buf, sizeof(buf), "%.1f KiB", double(b) / 1024);
  else
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(b));
  return buf;
}

ShardMetadata full_table(const EmbeddingBagConfig& t, int rank) {
  return ShardMetadata{0, t.num_embeddings, 0, t.embedding_dim, rank};
}

// Row blocks of ceil(rows / n) over n ranks (TorchRec's row-wise block size).
std::vector<ShardMetadata> row_blocks(const EmbeddingBagConfig& t, const std::vector<int>& ranks) {
  const int64_t n = int64_t(ranks.size());
  const int64_t block = (t.num_embeddings + n - 1) / n;
  std::vector<ShardMetadata> out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = std::min(i * block, t.num_embeddings);
    const int64_t end = std::min(start + block, t.num_embeddings);
    out.push_back(ShardMetadata{start, end - start, 0, t.embedding_dim, ranks[size_t(i)]});
  }
  return out;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(ranks[i]);
  }
  return s;
}

}  // namespace

const char* sharding_type_name(ShardingType type) { return kTypeNames[int(type)]; }

ShardingType parse_sharding_type(const std::string& name) {
  const std::string n = lower(name);
  for (int i = 0; i < 5; ++i)
    if (n == kTypeNames[i]) return ShardingType(i);
  MT_FAIL("unknown sharding type '", name,
          "'; expected data_parallel, table_wise, row_wise, column_wise or table_row_wise");
}

ParameterSharding data_parallel_sharding(const EmbeddingBagConfig& table, int world_size) {
  ParameterSharding p;
  p.type = ShardingType::DataParallel;
  for (int r = 0; r < world_size; ++r) {
    p.ranks.push_back(r);
    p.shards.push_back(full_table(table, r));
  }
  return p;
}

ParameterSharding table_wise_sharding(const EmbeddingBagConfig& table, int rank) {
  ParameterSharding p;
  p.type = ShardingType::TableWise;
  p.ranks = {rank};
  p.shards = {full_table(table, rank)};
  return p;
}

ParameterSharding column_wise_sharding(const EmbeddingBagConfig& table, std::vector<int> ranks) {
  const int64_t n = int64_t(ranks.size());
  MT_CHECK(n >= 1 && n <= table.embedding_dim, "column_wise sharding of table '", table.name,
           "': cannot split ", table.embedding_dim, " columns into ", n, " shards");
  ParameterSharding p;
  p.type = ShardingType::ColumnWise;
  int64_t col = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t width = table.embedding_dim / n + (i < table.embedding_dim % n ? 1 : 0);
    p.shards.push_back(ShardMetadata{0, table.num_embeddings, col, width, ranks[size_t(i)]});
    col += width;
  }
  p.ranks = std::move(ranks);
  return p;
}

ParameterSharding row_wise_sharding(const EmbeddingBagConfig& table, int world_size) {
  ParameterSharding p;
  p.type = ShardingType::RowWise;
  for (int r = 0; r < world_size; ++r) p.ranks.push_back(r);
  p.shards = row_blocks(table, p.ranks);
  return p;
}

ParameterSharding table_row_wise_sharding(const EmbeddingBagConfig& table, int node,
                                          int local_size) {
  ParameterSharding p;
  p.type = ShardingType::TableRowWise;
  for (int l = 0; l < local_size; ++l) p.ranks.push_back(node * local_size + l);
  p.shards = row_blocks(table, p.ranks);
  return p;
}

int64_t shard_bytes(const EmbeddingBagConfig& table, int64_t rows, int64_t cols,
                    runtime::DType dtype) {
  // A kv shard keeps only its cache in memory (its rows are in the store).
  if (table.storage == runtime::sparse::TableStorage::Kv && rows > 0)
    rows = table.kv_cache.rows_for(rows);
  const int64_t w = int64_t(runtime::dtype_size(dtype));
  const int64_t s = dtype == runtime::DType::F64 ? 8 : 4;  // optimizer state dtype
  int64_t state = 0;
  switch (table.optimizer.type) {
    case runtime::sparse::EmbOptimType::SGD:
      state = 0;
      break;
    case runtime::sparse::EmbOptimType::RowwiseAdagrad:
      state = rows;
      break;
    case runtime::sparse::EmbOptimType::Adam:
      state = 2 * rows * cols;
      break;
    case runtime::sparse::EmbOptimType::PartialRowwiseAdam:
      state = rows * cols + rows;
      break;
  }
  return rows * cols * w + state * s;
}

const ParameterSharding& ShardingPlan::at(const std::string& table) const {
  auto it = tables.find(table);
  if (it == tables.end()) {
    std::string names;
    for (const auto& [n, p] : tables) {
      if (!names.empty()) names += ", ";
      names += n;
    }
    MT_FAIL("sharding plan: no entry for table '", table, "' (planned: ", names, ")");
  }
  return it->second;
}

void ShardingPlan::validate(const std::vector<EmbeddingBagConfig>& configs) const {
  MT_CHECK(world_size >= 1, "sharding plan: world_size must be >= 1, got ", world_size);
  const int L = ranks_per_node();
  MT_CHECK(L >= 1 && world_size % L == 0, "sharding plan: local_size ", local_size,
           " does not divide the world size ", world_size);
  std::set<std::string> names;
  for (const EmbeddingBagConfig& t : configs) {
    names.insert(t.name);
    const ParameterSharding& p = at(t.name);
    const std::string what =
        std::string("sharding plan: table '") + t.name + "' (" + sharding_type_name(p.type) + ")";
    MT_CHECK(!p.shards.empty() && p.shards.size() == p.ranks.size(), what,
             ": expected one rank per shard, got ", p.shards.size(), " shards and ", p.ranks.size(),
             " ranks");
    for (size_t i = 0; i < p.shards.size(); ++i) {
      const ShardMetadata& s = p.shards[i];
      MT_CHECK(s.rank >= 0 && s.rank < world_size && s.rank == p.ranks[i], what, ": shard ", i,
               " is on rank ", s.rank, " (ranks lists ", p.ranks[i], "; world size ", world_size,
               ")");
      MT_CHECK(s.row_offset >= 0 && s.num_rows >= 0 &&
                   s.row_offset + s.num_rows <= t.num_embeddings && s.col_offset >= 0 &&
                   s.num_cols > 0 && s.col_offset + s.num_cols <= t.embedding_dim,
               what, ": shard ", i, " rows [", s.row_offset, ", +", s.num_rows, ") cols [",
               s.col_offset, ", +", s.num_cols, ") does not fit the table [", t.num_embeddings,
               ", ", t.embedding_dim, "]");
    }
    auto full_cols = [&](const ShardMetadata& s) {
      return s.col_offset == 0 && s.num_cols == t.embedding_dim;
    };
    auto full_rows = [&](const ShardMetadata& s) {
      return s.row_offset == 0 && s.num_rows == t.num_embeddings;
    };
    // Contiguous row blocks over `ranks` in order, covering the table.
    auto check_row_blocks = [&](const std::vector<int>& expected_ranks) {
      MT_CHECK(p.ranks == expected_ranks, what, ": expected shards on ranks [",
               join_ranks(expected_ranks), "] in order, got [", join_ranks(p.ranks), "]");
      int64_t row = 0;
      for (const ShardMetadata& s : p.shards) {
        MT_CHECK(
            full_cols(s) && s.row_offset == row, what,
            ": row shards must be contiguous full-width blocks in rank order; the shard on rank ",
            s.rank, " starts at row ", s.row_offset, " (expected ", row, ")");
        row += s.num_rows;
      }
      MT_CHECK(row == t.num_embeddings, what, ": row shards cover ", row, " of ", t.num_embeddings,
               " rows");
    };
    switch (p.type) {
      case ShardingType::DataParallel: {
        std::vector<int> all;
        for (int r = 0; r < world_size; ++r) all.push_back(r);
        MT_CHECK(p.ranks == all, what, ": a replicated table is held by every rank [0, ",
                 world_size, "), got [", join_ranks(p.ranks), "]");
        for (const ShardMetadata& s : p.shards)
          MT_CHECK(full_rows(s) && full_cols(s), what, ": every replica must be the whole table");
        break;
      }
      case ShardingType::TableWise:
        MT_CHECK(p.shards.size() == 1 && full_rows(p.shards[0]) && full_cols(p.shards[0]), what,
                 ": expected one shard holding the whole table");
        break;
      case ShardingType::ColumnWise: {
        std::set<int> distinct(p.ranks.begin(), p.ranks.end());
        MT_CHECK(distinct.size() == p.ranks.size(), what,
                 ": column shards must be on distinct ranks, got [", join_ranks(p.ranks), "]");
        int64_t col = 0;
        for (const ShardMetadata& s : p.shards) {
          MT_CHECK(
              full_rows(s) && s.col_offset == col, what,
              ": column shards must be contiguous full-height blocks in order; the shard on rank ",
              s.rank, " starts at column ", s.col_offset, " (expected ", col, ")");
          col += s.num_cols;
        }
        MT_CHECK(col == t.embedding_dim, what, ": column shards cover ", col, " of ",
                 t.embedding_dim, " columns");
        break;
      }
      case ShardingType::RowWise: {
        std::vector<int> all;
        for (int r = 0; r < world_size; ++r) all.push_back(r);
        check_row_blocks(all);
        break;
      }
      case ShardingType::TableRowWise: {
        const int node = p.ranks.front() / L;
        std::vector<int> local;
        for (int l = 0; l < L; ++l) local.push_back(node * L + l);
        check_row_blocks(local);
        break;
      }
    }
  }
  for (const auto& [name, p] : tables)
    MT_CHECK(names.count(name), "sharding plan: table '", name,
             "' is planned but is not one of the collection's tables");
}

std::vector<int64_t> ShardingPlan::bytes_per_rank(const std::vector<EmbeddingBagConfig>& configs,
                                                  runtime::DType dtype) const {
  std::vector<int64_t> bytes(size_t(world_size), 0);
  for (const EmbeddingBagConfig& t : configs)
    for (const ShardMetadata& s : at(t.name).shards)
      bytes.at(size_t(s.rank)) += shard_bytes(t, s.num_rows, s.num_cols, dtype);
  return bytes;
}

std::string ShardingPlan::describe(const std::vector<EmbeddingBagConfig>& configs,
                                   runtime::DType dtype) const {
  struct Row {
    std::string cells[6];
  };
  std::vector<Row> rows;
  rows.push_back(
      {{"table", "type", "ranks", "shards (rows x cols @ row,col)", "bytes per rank", "why"}});
  for (const EmbeddingBagConfig& t : configs) {
    const ParameterSharding& p = at(t.name);
    Row r;
    r.cells[0] = t.name + " [" + std::to_string(t.num_embeddings) + " x " +
                 std::to_string(t.embedding_dim) + "]" +
                 (t.storage == runtime::sparse::TableStorage::Kv ? " kv (bytes: its cache)" : "");
    r.cells[1] = sharding_type_name(p.type);
    r.cells[2] = join_ranks(p.ranks);
    std::map<int, int64_t> per_rank;
    std::ostringstream shards;
    for (size_t i = 0; i < p.shards.size(); ++i) {
      const ShardMetadata& s = p.shards[i];
      per_rank[s.rank] += shard_bytes(t, s.num_rows, s.num_cols, dtype);
      if (p.type == ShardingType::DataParallel && i > 0) continue;
      shards << (i ? "; " : "") << s.num_rows << "x" << s.num_cols << " @" << s.row_offset << ","
             << s.col_offset;
      if (p.type == ShardingType::DataParallel) shards << " (replicated)";
    }
    r.cells[3] = shards.str();
    std::string bytes;
    for (const auto& [rank, b] : per_rank) {
      if (!bytes.empty()) bytes += ", ";
      bytes += 'r';
      bytes += std::to_string(rank);
      bytes += ": ";
      bytes += format_bytes(b);
    }
    r.cells[4] = bytes;
    r.cells[5] = p.reason;
    rows.push_back(r);
  }
  size_t width[6] = {};
  for (const Row& r : rows)
    for (int c = 0; c < 6; ++c) width[c] = std::max(width[c], r.cells[c].size());
  std::ostringstream os;
  const int nodes = world_size / std::max(1, ranks_per_node());
  os << "sharding plan (world size " << world_size << ": " << nodes
     << (nodes == 1 ? " node, " : " nodes, ") << ranks_per_node()
     << (ranks_per_node() == 1 ? " rank" : " ranks") << " per node, "
     << runtime::dtype_name(dtype) << " tables):\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int c = 0; c < 6; ++c) {
      std::string cell = rows[i].cells[c];
      if (c < 5) cell.resize(width[c], ' ');
      os << cell << (c < 5 ? " | " : "");
    }
    os << "\n";
  }
  const std::vector<int64_t> total = bytes_per_rank(configs, dtype);
  os << "total per rank:";
  for (size_t r = 0; r < total.size(); ++r)
    os << " r" << r << " " << format_bytes(total[r]) << (r + 1 < total.size() ? "," : "");
  os << "\n";
  return os.str();
}

}  // namespace mt::parallel
