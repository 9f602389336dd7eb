// KvTable: one table shard whose rows (and their row-optimizer state) live in a KvStore
// (RocksDB), with a RowCache of hot rows in front: FBGEMM's SSD-backed table-batched embeddings.
//
// A step works on a WORKING SET: the sorted unique local rows its ids touch.
//   gather(rows)   copies them into dense tensors (weight [n, cols], the optimizer's state rows):
//                  from the cache, else from a finished prefetch, else from the store (one
//                  batched multi-get), else the row's initial value (never seen: drawn from the
//                  table's init key over the GLOBAL shape at its global row, exactly the value an
//                  in-memory table holds there; state zero)
//   (lookup and the fused optimizer run on the working set: ids remapped to 0..n-1 in the same
//   order, so results are bitwise those of the in-memory table, whatever the cache size)
//   scatter(ws)    puts the rows back into the cache; rows the cache evicts go to the store, written
//                  on the store's background thread (anything that reads the store waits first).
//   prefetch(rows) reads the next step's rows that are neither cached nor in the current working
//                  set from the store on the store's background thread while this step computes,
//                  and pins the cached ones against this step's write-back; gather() uses the
//                  rows read unless the step wrote them to the store meanwhile (then the store's
//                  newer value is read).
// A working set may be larger than the cache (rows then pass through to the store).
//
// Where the cache's rows live: in host memory (RowCache's bytes), or, for a table whose working
// sets are on a GPU (KvTableOptions::device), in DEVICE memory (FBGEMM keeps its cache in HBM):
// one tensor [cache slots, cols + state widths] on the device, so a step's hits are gathered on the
// device and only misses cross PCIe (uploaded), evictions downloaded. The host keeps the slots'
// bookkeeping (RowCache with no bytes). KvTableOptions::tensor_cache forces that layout on the
// CPU, where the tests check it bitwise against the byte cache.
//
// Row bytes: the weight's cols (table dtype), then each state field (f32; f64 for f64 tables).
// Checkpoints: flush() writes every cached row to the store; read_rows() gives any block of local
// rows from a consistent store view (missing rows: their initial values), write_rows() loads one.
// Raw-id tables (EmbeddingBagConfig::raw_ids): "rows" are the raw ids themselves (any id >= 0;
// the shard's row offset is 0), the shard keeps the ids that raw_id_owner gives its part, and a
// checkpoint saves the stored rows only (stored_bounds + read_stored, write_field_ids).
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "runtime/core/rng.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/init.h"
#include "runtime/sparse/embedding_config.h"
#include "runtime/sparse/kv/kv_store.h"
#include "runtime/sparse/kv/row_cache.h"

namespace mt::runtime::sparse {

struct KvTableOptions {
  int64_t cache_rows = 1;  // the cache's rows (rounded up to whole sets)
  CachePolicy policy = CachePolicy::LRU;
  // Raw-id tables: this shard keeps the ids with raw_id_owner(id, raw_parts) == raw_part.
  int64_t raw_part = 0, raw_parts = 1;
  // Where working sets are handed out (gather) and taken back (scatter); a non-CPU device keeps
  // the cache's rows in its memory.
  Device device = Device::cpu();
  bool tensor_cache = false;  // the device-memory layout also on the CPU (tests)
};

// Stored rows of a raw-id table shard (KvTable::read_stored): ids ascending, and their values.
struct KvStoredRows {
  std::vector<int64_t> ids;
  Tensor weight;             // [n, cols]
  std::vector<Tensor> state;  // per state field, [n, width]
};

// Where a step's rows came from, and what moved (cumulative; KvTable::stats).
struct KvStats {
  int64_t rows_requested = 0;   // working-set rows gathered
  int64_t cache_hits = 0;       // ... found in the cache
  int64_t prefetch_hits = 0;    // ... read ahead by a prefetch
  int64_t store_reads = 0;      // ... read from the store in gather (not hidden by a prefetch)
  int64_t initialised = 0;      // ... never seen before (initial values)
  int64_t rows_written = 0;     // rows written to the store (evictions, flushes)
  uint64_t bytes_read = 0, bytes_written = 0;  // row bytes to and from the store
  double gather_seconds = 0;    // time in gather (waiting for the store and prefetches)
  double prefetch_seconds = 0;  // store time the prefetches spent off the training thread
  KvStats& operator+=(const KvStats& other);  // sums (of several tables)
  KvStats& operator-=(const KvStats& other);  // what happened since `other` was taken
};
inline KvStats operator-(KvStats a, const KvStats& b) { return a -= b; }

struct KvWorkingSet {
  std::vector<int64_t> rows;  // local rows, sorted, unique
  Tensor weight;              // [n, cols]
  Tensor momentum1, momentum2;  // as row_state_fields (undefined when the table has none)
};

class KvTable {
 public:
  // `config`: resolved (its shard set). `has_state`: keeps the optimizer's row state (false for
  // frozen tables). `table_id`: this table's id in the store (unique per store).
  KvTable(std::shared_ptr<KvStore> store, uint32_t table_id, const EmbeddingBagConfig& config,
          DType dtype, bool has_state, const KvTableOptions& options);
  ~KvTable();

  // Where the initial values are drawn from: the init context of the whole table's module
  // (EmbeddingTable::init_context), whose key("weight") an in-memory table draws with.
  void set_init(const nn::InitContext& init) { init_ = init; }
  const EmbeddingBagConfig& config() const { return config_; }
  // Rows of the shard (raw-id tables: the rows it is expected to hold).
  int64_t local_rows() const { return config_.shard.num_rows; }
  bool raw_ids() const { return config_.raw_ids; }
  // Whether this shard keeps raw id `id` (raw-id tables; true for every id of a one-part table).
  bool owns(int64_t id) const;
  int64_t local_cols() const { return config_.shard.num_cols; }
  DType dtype() const { return dtype_; }
  // (name, width) of the state fields kept per row.
  const std::vector<std::pair<std::string, int64_t>>& state_fields() const { return fields_; }

  // The working set's tensors are on options.device (scatter takes them from any device).
  KvWorkingSet gather(std::vector<int64_t> rows);
  void scatter(const KvWorkingSet& ws);
  void prefetch(std::vector<int64_t> rows);

  // Writes every cached row to the store (they stay cached).
  void flush();
  // Local rows [first, first + count) into weight [count, cols] and state[i] [count, width_i],
  // from `view` (take it after flush()).
  void read_rows(int64_t first, int64_t count, const Tensor& weight,
                 const std::vector<Tensor>& state, const KvStore::View* view) const;
  // Replaces local rows [first, first + rows) with `weight` and `state` (as read_rows).
  void write_rows(int64_t first, const Tensor& weight, const std::vector<Tensor>& state);
  // Managed-collision evictions: the rows of `global_rows` this shard holds get fresh values
  // (EmbeddingTable::reset_rows's draw) and zero state.
  void reset_rows(const std::vector<int64_t>& global_rows, int64_t step);
  // Replaces one field of local rows [first, first + n): field -1 is the weight ([n, cols]),
  // i >= 0 state field i ([n, width_i]); the rows' other fields keep their values.
  void write_field(int64_t first, int field, const Tensor& values);
  // The same for the rows `rows` (local rows, or raw ids), in that order.
  void write_field_ids(const std::vector<int64_t>& rows, int field, const Tensor& values);

  // Raw-id tables' checkpoints, from `view` (take it after flush()):
  // the number of stored rows, and the id at every `every`-th of them (ascending: chunk bounds);
  int64_t stored_bounds(int64_t every, std::vector<int64_t>& bounds,
                        const KvStore::View* view) const;
  // the stored rows with first_id <= id < end_id.
  KvStoredRows read_stored(int64_t first_id, int64_t end_id, const KvStore::View* view) const;
  // Back to the initial values: the cache emptied, the table's rows erased from the store.
  void clear();
  // Rows held in the store (after flush(): every row ever touched).
  int64_t stored_rows();

  const KvStats& stats() const { return stats_; }
  KvStore& store() const { return *store_; }

 private:
  struct Prefetch;
  // The initial value of local row `row` (raw-id tables: of id `row`) with state zero, drawn from
  // `key` (default: the weight's) at the table's global row.
  void init_row(int64_t row, std::byte* bytes, const RandomKey* key = nullptr) const;
  void join_prefetch();
  // Row i of the dense tensors (weight [n, cols], state[f] [n, width_f], contiguous) from / into
  // a row's bytes.
  void unpack_row(const std::byte* src, int64_t i, const Tensor& weight,
                  const std::vector<Tensor>& state) const;
  void pack_row(std::byte* dst, int64_t i, const Tensor& weight,
                const std::vector<Tensor>& state) const;
  void write_to_store(const std::vector<int64_t>& rows, const std::vector<std::byte>& bytes);
  // The cache's rows as a tensor (the device-memory layout; tensor_cache()).
  bool tensor_cache() const { return slot_rows_.defined(); }
  // Tensor layout: the working set of `n` rows whose cached ones are hits (position, slot) and
  // the others' bytes are `bytes` rows at their positions.
  KvWorkingSet assemble(int64_t n, const std::vector<std::pair<int64_t, int64_t>>& hits,
                        const std::vector<std::byte>& bytes) const;
  // Tensor layout: `positions` (slots or working-set rows) as an i64 index on the device.
  Tensor device_index(const std::vector<int64_t>& positions) const;
  // Tensor layout: the bytes of the cached rows in `slots` (downloaded).
  std::vector<std::byte> download(const std::vector<int64_t>& slots) const;
  // Host layout: the working set's rows (host tensors) into the cache, evictions into `evicted`.
  void scatter_bytes(const std::vector<int64_t>& rows, const Tensor& weight,
                     const std::vector<Tensor>& state, std::vector<int64_t>& evicted,
                     std::vector<std::byte>& evicted_bytes);
  // Writes scatter's evicted rows to the store on its background thread.
  void write_evicted(std::vector<int64_t> evicted, std::vector<std::byte> evicted_bytes);
  // Tensor layout: scatter (the rows packed [n, width] on the device), evictions into `evicted`.
  void scatter_tensor(const KvWorkingSet& ws, std::vector<int64_t>& evicted,
                      std::vector<std::byte>& evicted_bytes);
  // Waits for the evictions scatter() handed to the store's background thread.
  void settle_writes();

  std::shared_ptr<KvStore> store_;
  uint32_t table_id_;
  EmbeddingBagConfig config_;
  DType dtype_, state_dtype_;
  std::vector<std::pair<std::string, int64_t>> fields_;
  size_t weight_bytes_, row_bytes_;
  RowCache cache_;
  nn::InitContext init_;
  std::unique_ptr<Prefetch> prefetch_;
  std::unordered_set<int64_t> written_since_prefetch_;
  std::vector<int64_t> current_;  // the last gather's rows (sorted)
  std::future<void> pending_write_;  // scatter's evictions, written in the background
  KvStats stats_;
  int64_t raw_part_, raw_parts_;
  Device device_;
  Tensor slot_rows_;  // the device-memory layout: [cache slots, row width] (else undefined)
};

}  // namespace mt::runtime::sparse
