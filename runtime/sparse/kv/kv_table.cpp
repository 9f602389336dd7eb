#include "runtime/sparse/kv/kv_table.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/nn/init.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"
#include "runtime/ops/join.h"
#include "runtime/sparse/fused_optimizer.h"

namespace mt::runtime::sparse {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

namespace {

// a = op(a, b) for every field of KvStats.
template <class Op>
void each_field(KvStats& a, const KvStats& b, Op op) {
  op(a.rows_requested, b.rows_requested);
  op(a.cache_hits, b.cache_hits);
  op(a.prefetch_hits, b.prefetch_hits);
  op(a.store_reads, b.store_reads);
  op(a.initialised, b.initialised);
  op(a.rows_written, b.rows_written);
  op(a.bytes_read, b.bytes_read);
  op(a.bytes_written, b.bytes_written);
  op(a.gather_seconds, b.gather_seconds);
  op(a.prefetch_seconds, b.prefetch_seconds);
}

}  // namespace

KvStats& KvStats::operator+=(const KvStats& o) {
  each_field(*this, o, [](auto& a, const auto& b) { a += b; });
  return *this;
}

KvStats& KvStats::operator-=(const KvStats& o) {
  each_field(*this, o, [](auto& a, const auto& b) { a -= b; });
  return *this;
}

// A background read of rows not cached when it started.
struct KvTable::Prefetch {
  std::vector<int64_t> rows;
  std::vector<std::byte> bytes;
  std::vector<bool> found;
  double seconds = 0;
  std::future<void> done;
};

KvTable::KvTable(std::shared_ptr<KvStore> store, uint32_t table_id,
                 const EmbeddingBagConfig& config, DType dtype, bool has_state,
                 const KvTableOptions& options)
    : store_(std::move(store)),
      table_id_(table_id),
      config_(config),
      dtype_(dtype),
      state_dtype_(dtype == DType::F64 ? DType::F64 : DType::F32),
      fields_(has_state ? row_state_fields(config.optimizer.type, config.shard.num_cols)
                        : std::vector<std::pair<std::string, int64_t>>{}),
      weight_bytes_(size_t(config.shard.num_cols) * dtype_size(dtype)),
      row_bytes_([&] {
        size_t b = weight_bytes_;
        for (const auto& [name, width] : fields_) b += size_t(width) * dtype_size(state_dtype_);
        return b;
      }()),
      cache_(std::max<int64_t>(1, options.cache_rows),
             options.tensor_cache || !options.device.is_cpu() ? 0 : row_bytes_, options.policy),
      raw_part_(options.raw_part),
      raw_parts_(options.raw_parts),
      device_(options.device) {
  MT_CHECK(store_ != nullptr, "KvTable '", config.name, "': no store");
  MT_CHECK(dtype == DType::F32 || dtype == DType::F64, "KvTable '", config.name,
           "': tables must be f32 or f64, got ", dtype_name(dtype));
  MT_CHECK(config.shard.num_rows >= 0 && config.shard.num_cols > 0, "KvTable '", config.name,
           "': the shard must be resolved (rows ", config.shard.num_rows, ", cols ",
           config.shard.num_cols, ")");
  MT_CHECK(options.cache_rows >= 1, "KvTable '", config.name, "': cache_rows must be >= 1, got ",
           options.cache_rows);
  MT_CHECK(options.raw_parts >= 1 && options.raw_part >= 0 && options.raw_part < options.raw_parts,
           "KvTable '", config.name, "': raw_part ", options.raw_part, " of ", options.raw_parts,
           " parts");
  MT_CHECK(!config.raw_ids || config.shard.row_offset == 0, "KvTable '", config.name,
           "': a raw-id table's shard holds ids, not a row block (row_offset must be 0, got ",
           config.shard.row_offset, ")");
  if (options.tensor_cache || !options.device.is_cpu()) {
    // One row of the table's dtype per slot: the weight's cols, then the state fields (the
    // same dtype: f32, or f64 for f64 tables).
    slot_rows_ = zeros({cache_.capacity(), int64_t(row_bytes_ / dtype_size(dtype_))},
                       TensorOptions{}.with_dtype(dtype_).with_device(device_));
  }
}

bool KvTable::owns(int64_t id) const {
  return raw_parts_ == 1 || raw_id_owner(id, raw_parts_) == raw_part_;
}

KvTable::~KvTable() {
  if (prefetch_ && prefetch_->done.valid()) prefetch_->done.wait();
  if (pending_write_.valid()) pending_write_.wait();  // its task reads this table's members
}

int64_t KvTable::stored_rows() {
  settle_writes();
  return store_->count(table_id_, row_bytes_);
}

void KvTable::unpack_row(const std::byte* src, int64_t i, const Tensor& weight,
                         const std::vector<Tensor>& state) const {
  std::memcpy(static_cast<std::byte*>(weight.data_ptr()) + size_t(i) * weight_bytes_, src,
              weight_bytes_);
  size_t off = weight_bytes_;
  for (size_t f = 0; f < fields_.size(); ++f) {
    const size_t fb = size_t(fields_[f].second) * dtype_size(state_dtype_);
    std::memcpy(static_cast<std::byte*>(state[f].data_ptr()) + size_t(i) * fb, src + off, fb);
    off += fb;
  }
}

void KvTable::pack_row(std::byte* dst, int64_t i, const Tensor& weight,
                       const std::vector<Tensor>& state) const {
  std::memcpy(dst, static_cast<const std::byte*>(weight.data_ptr()) + size_t(i) * weight_bytes_,
              weight_bytes_);
  size_t off = weight_bytes_;
  for (size_t f = 0; f < fields_.size(); ++f) {
    const size_t fb = size_t(fields_[f].second) * dtype_size(state_dtype_);
    std::memcpy(dst + off, static_cast<const std::byte*>(state[f].data_ptr()) + size_t(i) * fb,
                fb);
    off += fb;
  }
}

void KvTable::init_row(int64_t row, std::byte* bytes, const RandomKey* key) const {
  // What init_uniform_ draws over the global [num_embeddings, dim] table at (global row, column):
  // element global_row * dim + col of the key's stream (for raw ids past num_embeddings too).
  const auto [lo, hi] = init_bounds(config_);
  const RandomKey& k = key ? *key : init_.key("weight");
  const uint64_t first = uint64_t(config_.shard.row_offset + row) * uint64_t(config_.embedding_dim) +
                         uint64_t(config_.shard.col_offset);
  for (int64_t c = 0; c < local_cols(); ++c) {
    const double v = lo + (hi - lo) * uniform_at(k, first + uint64_t(c));
    if (dtype_ == DType::F64)
      reinterpret_cast<double*>(bytes)[c] = v;
    else
      reinterpret_cast<float*>(bytes)[c] = float(v);
  }
  std::memset(bytes + weight_bytes_, 0, row_bytes_ - weight_bytes_);
}

void KvTable::join_prefetch() {
  if (!prefetch_) return;
  prefetch_->done.get();  // rethrows the store's errors here
  stats_.prefetch_seconds += prefetch_->seconds;
}

KvWorkingSet KvTable::gather(std::vector<int64_t> rows) {
  const auto t0 = Clock::now();
  NoGradGuard no_grad;
  // Raw-id tables: any id >= 0 (the routing gave this shard its own).
  const int64_t end = raw_ids() ? std::numeric_limits<int64_t>::max() : local_rows();
  for (size_t i = 0; i < rows.size(); ++i)
    MT_CHECK(rows[i] >= 0 && rows[i] < end && (i == 0 || rows[i] > rows[i - 1]), "KvTable '",
             config_.name, "': gather takes sorted unique rows in [0, ", end, "), got ", rows[i],
             " at ", i);
  join_prefetch();
  const int64_t n = int64_t(rows.size());
  std::vector<std::byte> bytes(size_t(n) * row_bytes_);
  std::vector<int64_t> missing;  // positions
  std::vector<std::pair<int64_t, int64_t>> hits;  // tensor layout: (position, slot)
  size_t p = 0;                  // walks the prefetched rows (sorted)
  for (int64_t i = 0; i < n; ++i) {
    std::byte* dst = bytes.data() + size_t(i) * row_bytes_;
    const int64_t slot = cache_.find(rows[size_t(i)]);
    if (slot >= 0) {
      if (tensor_cache())
        hits.emplace_back(i, slot);
      else
        std::memcpy(dst, cache_.row(slot), row_bytes_);
      ++stats_.cache_hits;
      continue;
    }
    if (prefetch_) {
      const auto& pr = prefetch_->rows;
      while (p < pr.size() && pr[p] < rows[size_t(i)]) ++p;
      if (p < pr.size() && pr[p] == rows[size_t(i)] &&
          !written_since_prefetch_.count(rows[size_t(i)])) {
        if (prefetch_->found[p]) {
          std::memcpy(dst, prefetch_->bytes.data() + p * row_bytes_, row_bytes_);
          ++stats_.prefetch_hits;
        } else {  // never stored: the prefetch only learnt that
          init_row(rows[size_t(i)], dst);
          ++stats_.initialised;
        }
        continue;
      }
    }
    missing.push_back(i);
  }
  prefetch_.reset();
  written_since_prefetch_.clear();
  cache_.unpin_all();
  if (!missing.empty()) {
    settle_writes();  // the evictions written in the background must land before these reads
    std::vector<int64_t> keys;
    for (int64_t i : missing) keys.push_back(rows[size_t(i)]);
    std::vector<std::byte> fetched(keys.size() * row_bytes_);
    const std::vector<bool> found = store_->multi_get(table_id_, keys, row_bytes_, fetched.data());
    for (size_t k = 0; k < keys.size(); ++k) {
      std::byte* dst = bytes.data() + size_t(missing[k]) * row_bytes_;
      if (found[k]) {
        std::memcpy(dst, fetched.data() + k * row_bytes_, row_bytes_);
        ++stats_.store_reads;
        stats_.bytes_read += row_bytes_;
      } else {
        init_row(keys[k], dst);
        ++stats_.initialised;
      }
    }
  }
  stats_.rows_requested += n;
  current_ = rows;
  if (tensor_cache()) {
    KvWorkingSet ws = assemble(n, hits, bytes);
    ws.rows = std::move(rows);
    stats_.gather_seconds += seconds_since(t0);
    return ws;
  }

  // Rows -> dense tensors (weight, then each state field).
  KvWorkingSet ws;
  ws.rows = std::move(rows);
  ws.weight = empty({n, local_cols()}, TensorOptions{}.with_dtype(dtype_));
  std::vector<Tensor> state;
  for (const auto& [name, width] : fields_)
    state.push_back(empty({n, width}, TensorOptions{}.with_dtype(state_dtype_)));
  for (int64_t i = 0; i < n; ++i)
    unpack_row(bytes.data() + size_t(i) * row_bytes_, i, ws.weight, state);
  if (state.size() > 0) ws.momentum1 = state[0];
  if (state.size() > 1) ws.momentum2 = state[1];
  stats_.gather_seconds += seconds_since(t0);
  return ws;
}

void KvTable::write_to_store(const std::vector<int64_t>& rows,
                             const std::vector<std::byte>& bytes) {
  settle_writes();
  if (rows.empty()) return;
  store_->put(table_id_, rows, row_bytes_, bytes.data());
  stats_.rows_written += int64_t(rows.size());
  stats_.bytes_written += rows.size() * row_bytes_;
  if (prefetch_) written_since_prefetch_.insert(rows.begin(), rows.end());
}

void KvTable::scatter(const KvWorkingSet& ws) {
  const int64_t n = int64_t(ws.rows.size());
  MT_CHECK(ws.weight.defined() && ws.weight.dim() == 2 && ws.weight.size(0) == n &&
               ws.weight.size(1) == local_cols() && ws.weight.is_contiguous(),
           "KvTable '", config_.name, "': scatter of a working set that is not this table's");
  std::vector<Tensor> state;
  for (const Tensor* t : {&ws.momentum1, &ws.momentum2})
    if (t->defined()) state.push_back(*t);
  MT_CHECK(state.size() == fields_.size(), "KvTable '", config_.name, "': the working set has ",
           state.size(), " state fields, the table ", fields_.size());
  std::vector<int64_t> evicted;
  std::vector<std::byte> evicted_bytes;
  if (tensor_cache()) {
    scatter_tensor(ws, evicted, evicted_bytes);
  } else {
    // The byte cache is on the host: rows from a device come back first.
    Tensor weight = ws.weight.to(Device::cpu()).contiguous();
    for (Tensor& t : state) t = t.to(Device::cpu()).contiguous();
    scatter_bytes(ws.rows, weight, state, evicted, evicted_bytes);
  }
  write_evicted(std::move(evicted), std::move(evicted_bytes));
}

void KvTable::scatter_bytes(const std::vector<int64_t>& rows, const Tensor& weight,
                            const std::vector<Tensor>& state, std::vector<int64_t>& evicted,
                            std::vector<std::byte>& evicted_bytes) {
  const int64_t n = int64_t(rows.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[size_t(i)];
    int64_t slot = cache_.peek(row);
    if (slot < 0) {
      const RowCache::Insert r = cache_.insert(row);
      slot = r.slot;
      if (r.evicted) {
        evicted.push_back(r.evicted_key);
        evicted_bytes.insert(evicted_bytes.end(), cache_.row(slot), cache_.row(slot) + row_bytes_);
      }
    }
    pack_row(cache_.row(slot), i, weight, state);
  }
}

KvWorkingSet KvTable::assemble(int64_t n, const std::vector<std::pair<int64_t, int64_t>>& hits,
                               const std::vector<std::byte>& bytes) const {
  NoGradGuard no_grad;
  const int64_t width = slot_rows_.size(1);
  Tensor packed = empty({n, width}, TensorOptions{}.with_dtype(dtype_).with_device(device_));
  // The rows not cached: their bytes (packed like a slot's row) uploaded in one copy.
  std::vector<int64_t> miss_pos;
  size_t h = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (h < hits.size() && hits[h].first == i) {
      ++h;
      continue;
    }
    miss_pos.push_back(i);
  }
  if (!miss_pos.empty()) {
    const Tensor host = empty({int64_t(miss_pos.size()), width}, TensorOptions{}.with_dtype(dtype_));
    auto* dst = static_cast<std::byte*>(host.data_ptr());
    for (size_t k = 0; k < miss_pos.size(); ++k)
      std::memcpy(dst + k * row_bytes_, bytes.data() + size_t(miss_pos[k]) * row_bytes_,
                  row_bytes_);
    index_copy_(packed, 0, device_index(miss_pos), host.to(device_));
  }
  // The cached rows, gathered on the device.
  if (!hits.empty()) {
    std::vector<int64_t> pos, slots;
    for (const auto& [i, slot] : hits) {
      pos.push_back(i);
      slots.push_back(slot);
    }
    index_copy_(packed, 0, device_index(pos), index_select(slot_rows_, 0, device_index(slots)));
  }
  KvWorkingSet ws;
  ws.weight = packed.narrow(1, 0, local_cols()).contiguous();
  int64_t col = local_cols();
  std::vector<Tensor> state;
  for (const auto& [name, w] : fields_) {
    state.push_back(packed.narrow(1, col, w).contiguous());
    col += w;
  }
  if (state.size() > 0) ws.momentum1 = state[0];
  if (state.size() > 1) ws.momentum2 = state[1];
  return ws;
}

Tensor KvTable::device_index(const std::vector<int64_t>& positions) const {
  return from_vector<int64_t>(positions, {int64_t(positions.size())},
                              TensorOptions{}.with_dtype(DType::I64).with_device(device_));
}

std::vector<std::byte> KvTable::download(const std::vector<int64_t>& slots) const {
  std::vector<std::byte> bytes(slots.size() * row_bytes_);
  if (slots.empty()) return bytes;
  NoGradGuard no_grad;
  const Tensor host =
      index_select(slot_rows_, 0, device_index(slots)).to(Device::cpu()).contiguous();
  std::memcpy(bytes.data(), host.data_ptr(), bytes.size());
  return bytes;
}

void KvTable::scatter_tensor(const KvWorkingSet& ws, std::vector<int64_t>& evicted,
                             std::vector<std::byte>& evicted_bytes) {
  NoGradGuard no_grad;
  const int64_t n = int64_t(ws.rows.size());
  std::vector<Tensor> parts{ws.weight.to(device_)};
  for (const Tensor* t : {&ws.momentum1, &ws.momentum2})
    if (t->defined()) parts.push_back(t->to(device_));
  const Tensor packed = parts.size() == 1 ? parts[0].contiguous() : cat(parts, 1);
  // Slots as the host cache assigns them. A row evicted here leaves with its latest value: the
  // slot's old content, or, when this scatter had put it there, its row of `packed`.
  std::vector<int64_t> slot_of(size_t(n), -1);
  std::unordered_map<int64_t, int64_t> position_in_slot;
  std::vector<int64_t> old_slots, from_packed;  // eviction sources, in eviction order
  std::vector<bool> evicted_from_packed;
  for (int64_t i = 0; i < n; ++i) {
    int64_t slot = cache_.peek(ws.rows[size_t(i)]);
    if (slot < 0) {
      const RowCache::Insert r = cache_.insert(ws.rows[size_t(i)]);
      slot = r.slot;
      if (r.evicted) {
        evicted.push_back(r.evicted_key);
        auto it = position_in_slot.find(slot);
        evicted_from_packed.push_back(it != position_in_slot.end());
        if (it != position_in_slot.end()) {
          from_packed.push_back(it->second);
          slot_of[size_t(it->second)] = -1;  // that row now lives in the store only
        } else {
          old_slots.push_back(slot);
        }
      }
    }
    slot_of[size_t(i)] = slot;
    position_in_slot[slot] = i;
  }
  if (!evicted.empty()) {
    const std::vector<std::byte> old = download(old_slots);
    std::vector<std::byte> newer(from_packed.size() * row_bytes_);
    if (!from_packed.empty()) {
      const Tensor host =
          index_select(packed, 0, device_index(from_packed)).to(Device::cpu()).contiguous();
      std::memcpy(newer.data(), host.data_ptr(), newer.size());
    }
    size_t o = 0, p = 0;
    for (bool mine : evicted_from_packed) {
      const std::byte* src = mine ? newer.data() + (p++) * row_bytes_ : old.data() + (o++) * row_bytes_;
      evicted_bytes.insert(evicted_bytes.end(), src, src + row_bytes_);
    }
  }
  std::vector<int64_t> pos, slots;
  for (int64_t i = 0; i < n; ++i)
    if (slot_of[size_t(i)] >= 0) {
      pos.push_back(i);
      slots.push_back(slot_of[size_t(i)]);
    }
  if (slots.empty()) return;
  const Tensor rows = int64_t(slots.size()) == n ? packed : index_select(packed, 0, device_index(pos));
  index_copy_(slot_rows_, 0, device_index(slots), rows);
}

void KvTable::write_evicted(std::vector<int64_t> evicted, std::vector<std::byte> evicted_bytes) {
  // In the background (after any prefetch queued before it; gather and the other store users
  // wait for it): the training thread does not wait for RocksDB's write.
  if (evicted.empty()) return;
  stats_.rows_written += int64_t(evicted.size());
  stats_.bytes_written += evicted.size() * row_bytes_;
  if (prefetch_) written_since_prefetch_.insert(evicted.begin(), evicted.end());
  settle_writes();  // one write in flight at a time
  auto rows = std::make_shared<std::vector<int64_t>>(std::move(evicted));
  auto bytes = std::make_shared<std::vector<std::byte>>(std::move(evicted_bytes));
  pending_write_ = store_->background(
      KvStore::Lane::Write, [this, rows, bytes] { store_->put(table_id_, *rows, row_bytes_, bytes->data()); });
}

void KvTable::prefetch(std::vector<int64_t> rows) {
  join_prefetch();  // one in flight at a time
  // Earlier evictions land first (reads and writes run on different threads); the ones this
  // step writes meanwhile are tracked in written_since_prefetch_.
  settle_writes();
  prefetch_.reset();
  written_since_prefetch_.clear();
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  // Cached rows stay (pinned against this step's write-back); the current step's rows go back
  // to the cache after it: neither is read.
  std::erase_if(rows, [&](int64_t r) {
    const int64_t slot = cache_.peek(r);
    if (slot >= 0) cache_.pin(slot);
    return slot >= 0 || std::binary_search(current_.begin(), current_.end(), r);
  });
  auto p = std::make_unique<Prefetch>();
  p->rows = std::move(rows);
  p->bytes.resize(p->rows.size() * row_bytes_);
  Prefetch* raw = p.get();
  p->done = store_->background(KvStore::Lane::Read, [this, raw] {
    const auto t0 = Clock::now();
    raw->found = store_->multi_get(table_id_, raw->rows, row_bytes_, raw->bytes.data());
    raw->seconds = seconds_since(t0);
  });
  prefetch_ = std::move(p);
}

void KvTable::settle_writes() {
  if (pending_write_.valid()) pending_write_.get();  // rethrows a failed write here
}

void KvTable::flush() {
  std::vector<int64_t> rows, slots;
  std::vector<std::byte> bytes;
  for (const auto& [key, slot] : cache_.entries()) {
    rows.push_back(key);
    if (tensor_cache())
      slots.push_back(slot);
    else
      bytes.insert(bytes.end(), cache_.row(slot), cache_.row(slot) + row_bytes_);
  }
  if (tensor_cache()) bytes = download(slots);
  write_to_store(rows, bytes);
}

void KvTable::read_rows(int64_t first, int64_t count, const Tensor& weight,
                        const std::vector<Tensor>& state, const KvStore::View* view) const {
  MT_CHECK(first >= 0 && count >= 0 && first + count <= local_rows() && weight.is_contiguous() &&
               weight.dtype() == dtype_ && weight.numel() == count * local_cols() &&
               state.size() == fields_.size(),
           "KvTable '", config_.name, "': read_rows of rows [", first, ", +", count,
           ") into buffers that do not fit");
  // Initial values everywhere (one draw over the block: the rows are contiguous), then the
  // stored rows over them.
  const auto [lo, hi] = init_bounds(config_);
  nn::init_uniform_(weight.view({count, local_cols()}), init_.key("weight"), lo, hi,
                    {config_.num_embeddings, config_.embedding_dim},
                    {config_.shard.row_offset + first, config_.shard.col_offset});
  for (const Tensor& s : state) s.zero_();
  auto put = [&](int64_t r, const std::byte* src) { unpack_row(src, r - first, weight, state); };
  store_->scan(table_id_, first, first + count, row_bytes_, put, view);
}

void KvTable::write_rows(int64_t first, const Tensor& weight, const std::vector<Tensor>& state) {
  const int64_t count = weight.dim() == 2 ? weight.size(0) : -1;
  MT_CHECK(count >= 0 && first >= 0 && first + count <= local_rows() && weight.is_contiguous() &&
               weight.dtype() == dtype_ && weight.size(1) == local_cols() &&
               state.size() == fields_.size(),
           "KvTable '", config_.name, "': write_rows at ", first, " of a ", weight.shape(),
           " block that does not fit");
  std::vector<int64_t> rows;
  std::vector<std::byte> bytes(size_t(count) * row_bytes_);
  for (int64_t i = 0; i < count; ++i) {
    rows.push_back(first + i);
    pack_row(bytes.data() + size_t(i) * row_bytes_, i, weight, state);
    cache_.erase(first + i);
  }
  write_to_store(rows, bytes);
}

void KvTable::reset_rows(const std::vector<int64_t>& global_rows, int64_t step) {
  MT_CHECK(!raw_ids(), "KvTable '", config_.name, "': reset_rows (managed-collision evictions) ",
           "does not apply to a raw-id table: it keys rows by the ids themselves");
  const RandomKey key = init_.key("weight.reset").with_offset(uint64_t(step));
  std::vector<int64_t> stored;
  std::vector<std::byte> bytes;
  std::vector<std::byte> row(row_bytes_);
  for (int64_t g : global_rows) {
    MT_CHECK(g >= 0 && g < config_.num_embeddings, "KvTable '", config_.name, "': reset_rows: row ",
             g, " is outside the table's ", config_.num_embeddings, " rows");
    const int64_t r = g - config_.shard.row_offset;
    if (r < 0 || r >= local_rows()) continue;
    init_row(r, row.data(), &key);
    const int64_t slot = cache_.peek(r);
    if (slot >= 0 && tensor_cache()) {
      NoGradGuard no_grad;
      const Tensor host = empty({1, slot_rows_.size(1)}, TensorOptions{}.with_dtype(dtype_));
      std::memcpy(host.data_ptr(), row.data(), row_bytes_);
      index_copy_(slot_rows_, 0, device_index({slot}), host.to(device_));
    } else if (slot >= 0) {
      std::memcpy(cache_.row(slot), row.data(), row_bytes_);
    } else {
      stored.push_back(r);
      bytes.insert(bytes.end(), row.begin(), row.end());
    }
  }
  write_to_store(stored, bytes);
}

void KvTable::write_field(int64_t first, int field, const Tensor& values) {
  MT_CHECK(values.dim() == 2 && first >= 0 && first + values.size(0) <= local_rows(), "KvTable '",
           config_.name, "': write_field of a ", values.shape(), " block at row ", first,
           " outside its ", local_rows(), " rows");
  std::vector<int64_t> rows(size_t(values.size(0)));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = first + int64_t(i);
  write_field_ids(rows, field, values);
}

void KvTable::write_field_ids(const std::vector<int64_t>& rows, int field, const Tensor& values) {
  const int64_t n = int64_t(rows.size());
  const int64_t width =
      field < 0 ? local_cols() : field < int(fields_.size()) ? fields_[size_t(field)].second : -1;
  MT_CHECK(width > 0 && values.dim() == 2 && values.size(0) == n && values.size(1) == width,
           "KvTable '", config_.name, "': write_field ", field, " of ", n, " rows with a ",
           values.shape(), " block");
  const int64_t end = raw_ids() ? std::numeric_limits<int64_t>::max() : local_rows();
  for (int64_t r : rows)
    MT_CHECK(r >= 0 && r < end, "KvTable '", config_.name, "': write_field of row ", r,
             " outside [0, ", end, ")");
  if (n == 0) return;
  flush();  // also lands the evictions written in the background
  // The rows as stored (or their initial values), the field replaced, written back.
  std::vector<std::byte> bytes(size_t(n) * row_bytes_);
  const std::vector<bool> found = store_->multi_get(table_id_, rows, row_bytes_, bytes.data());
  for (int64_t i = 0; i < n; ++i)
    if (!found[size_t(i)]) init_row(rows[size_t(i)], bytes.data() + size_t(i) * row_bytes_);
  const Tensor v = values.contiguous().to(field < 0 ? dtype_ : state_dtype_);
  size_t off = 0;
  for (int f = 0; f < field; ++f) off += size_t(fields_[size_t(f)].second) * dtype_size(state_dtype_);
  if (field >= 0) off += weight_bytes_;
  const size_t fb = size_t(width) * dtype_size(v.dtype());
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(bytes.data() + size_t(i) * row_bytes_ + off,
                static_cast<const std::byte*>(v.data_ptr()) + size_t(i) * fb, fb);
    cache_.erase(rows[size_t(i)]);
  }
  write_to_store(rows, bytes);
}

int64_t KvTable::stored_bounds(int64_t every, std::vector<int64_t>& bounds,
                               const KvStore::View* view) const {
  MT_CHECK(every >= 1, "KvTable '", config_.name, "': stored_bounds every ", every);
  bounds.clear();
  int64_t count = 0;
  store_->scan(table_id_, 0, std::numeric_limits<int64_t>::max(), row_bytes_,
               [&](int64_t row, const std::byte*) {
                 if (count++ % every == 0) bounds.push_back(row);
               },
               view);
  return count;
}

KvStoredRows KvTable::read_stored(int64_t first_id, int64_t end_id,
                                  const KvStore::View* view) const {
  std::vector<std::byte> bytes;
  KvStoredRows out;
  store_->scan(table_id_, first_id, end_id, row_bytes_,
               [&](int64_t row, const std::byte* src) {
                 out.ids.push_back(row);
                 bytes.insert(bytes.end(), src, src + row_bytes_);
               },
               view);
  const int64_t n = int64_t(out.ids.size());
  out.weight = empty({n, local_cols()}, TensorOptions{}.with_dtype(dtype_));
  for (const auto& [name, width] : fields_)
    out.state.push_back(empty({n, width}, TensorOptions{}.with_dtype(state_dtype_)));
  for (int64_t i = 0; i < n; ++i)
    unpack_row(bytes.data() + size_t(i) * row_bytes_, i, out.weight, out.state);
  return out;
}

void KvTable::clear() {
  settle_writes();
  join_prefetch();
  prefetch_.reset();
  written_since_prefetch_.clear();
  cache_.clear();
  store_->erase_table(table_id_);
}

}  // namespace mt::runtime::sparse
