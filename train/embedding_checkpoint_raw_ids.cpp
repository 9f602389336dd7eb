// Checkpoint pieces of raw-id kv tables: their stored rows only (embedding_checkpoint_detail.h).
#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "checkpoint/distributed_checkpoint.h"
#include "parallel/comm/object_collectives.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"
#include "train/embedding_checkpoint_detail.h"

namespace mt::train::embedding_checkpoint {

using checkpoint::CheckpointState;
using checkpoint::TensorPiece;
using parallel::LocalShard;
using runtime::DType;
using runtime::Shape;
using runtime::Tensor;
using runtime::sparse::KvStore;
using runtime::sparse::KvStoredRows;
using runtime::sparse::KvTable;

namespace {

constexpr int64_t kNoEnd = std::numeric_limits<int64_t>::max();

runtime::TensorOptions with(DType dtype) { return runtime::TensorOptions{}.with_dtype(dtype); }

DType state_dtype(DType table) { return table == DType::F64 ? DType::F64 : DType::F32; }

std::string raw_rows_key(const std::string& optimizer_prefix, const std::string& table) {
  return optimizer_prefix + "state." + weight_fqn(table) + ".raw_id_rows";
}

// One saved chunk of a shard's stored rows (ids in [first, end)), read once from the store view
// by whichever of its pieces the writer produces first and dropped when all have taken theirs.
struct SaveChunk {
  std::shared_ptr<KvTable> kv;
  std::shared_ptr<const KvStore::View> view;
  int64_t first = 0, end = 0, rows = 0;
  int pieces = 0;  // ids, weight, state fields

  std::mutex mutex;
  std::optional<KvStoredRows> read;
  int taken = 0;

  // field -2: the ids, -1: the weight, i >= 0: state field i.
  Tensor take(int field) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!read) {
      read = kv->read_stored(first, end, view.get());
      MT_CHECK(int64_t(read->ids.size()) == rows, "embedding checkpoint: kv table '",
               kv->config().name, "': ", read->ids.size(), " rows stored in [", first, ", ", end,
               "), ", rows, " when the save began (the store view changed)");
    }
    const Tensor out =
        field == -2 ? runtime::from_vector<int64_t>(read->ids, {rows}, with(DType::I64))
        : field == -1 ? read->weight
                      : read->state[size_t(field)];
    if (++taken == pieces) read.reset();
    return out;
  }
};

}  // namespace

void add_raw_id_pieces(const parallel::ShardedEmbeddingBagCollection& ebc,
                       const std::string& model_prefix, const std::string& optimizer_prefix,
                       CheckpointState& state) {
  std::vector<const parallel::EmbeddingBagConfig*> tables;
  for (const auto& c : ebc.table_configs())
    if (c.raw_ids) tables.push_back(&c);
  if (tables.empty()) return;  // the same on every rank: no collective
  const std::vector<LocalShard> shards = ebc.local_shards();
  // Each shard's stored rows, from one store view, and the ids where its chunks start.
  std::vector<const LocalShard*> mine(tables.size(), nullptr);
  std::vector<std::shared_ptr<const KvStore::View>> views(tables.size());
  std::vector<std::vector<int64_t>> bounds(tables.size());
  std::vector<double> counts(tables.size(), 0.0);
  for (size_t t = 0; t < tables.size(); ++t)
    for (const LocalShard& s : shards)
      if (s.table == tables[t]->name && s.kv) {
        mine[t] = &s;
        views[t] = s.kv->store().view();
        counts[t] = double(s.kv->stored_bounds(kKvChunkRows, bounds[t], views[t].get()));
      }
  const std::vector<double> all =
      parallel::all_gather_values(ebc.group(), counts, "checkpoint.raw_id_rows");
  const int me = ebc.group().rank();
  for (size_t t = 0; t < tables.size(); ++t) {
    const parallel::EmbeddingBagConfig& c = *tables[t];
    int64_t total = 0, offset = 0;
    for (size_t r = 0; r * tables.size() + t < all.size(); ++r) {
      const int64_t n = int64_t(all[r * tables.size() + t]);
      if (int(r) < me) offset += n;
      total += n;
    }
    state.values[raw_rows_key(optimizer_prefix, c.name)] = total;
    if (!mine[t]) continue;
    const std::shared_ptr<KvTable> kv = mine[t]->kv;
    const std::vector<Field> fields = fields_of(c);
    const int64_t rows = int64_t(counts[t]), dim = c.embedding_dim;
    const std::string base = optimizer_prefix + "state." + weight_fqn(c.name) + ".";
    for (size_t k = 0; k < bounds[t].size(); ++k) {
      auto chunk = std::make_shared<SaveChunk>();
      chunk->kv = kv;
      chunk->view = views[t];
      chunk->first = bounds[t][k];
      chunk->end = k + 1 < bounds[t].size() ? bounds[t][k + 1] : kNoEnd;
      chunk->rows = std::min(kKvChunkRows, rows - int64_t(k) * kKvChunkRows);
      chunk->pieces = 2 + int(fields.size());
      const int64_t n = chunk->rows, at = offset + int64_t(k) * kKvChunkRows;
      TensorPiece ids{model_prefix + ids_fqn(c.name),
                      checkpoint::lazy_placeholder({n}, DType::I64), {total}, {at}};
      ids.produce = [chunk] { return chunk->take(-2); };
      state.tensors.push_back(std::move(ids));
      TensorPiece w{model_prefix + weight_fqn(c.name),
                    checkpoint::lazy_placeholder({n, dim}, kv->dtype()), {total, dim}, {at, 0}};
      w.produce = [chunk] { return chunk->take(-1); };
      state.tensors.push_back(std::move(w));
      for (const Field& f : fields) {
        const int i = kv_field(*kv, f.name);
        const DType sd = state_dtype(kv->dtype());
        TensorPiece piece =
            f.row_wise ? TensorPiece{base + f.name, checkpoint::lazy_placeholder({n}, sd), {total},
                                     {at}}
                       : TensorPiece{base + f.name, checkpoint::lazy_placeholder({n, dim}, sd),
                                     {total, dim}, {at, 0}};
        if (f.row_wise)
          piece.produce = [chunk, i, n] { return chunk->take(i).view({n}); };
        else
          piece.produce = [chunk, i] { return chunk->take(i); };
        state.tensors.push_back(std::move(piece));
      }
    }
  }
}

namespace {

// One loaded chunk's ids (read from the ids piece, or implied by a dense checkpoint) and the
// positions of those this shard owns; its weight and state pieces write those rows.
struct LoadChunk {
  bool ready = false;
  std::vector<int64_t> mine;  // owned ids
  Tensor positions;           // their positions in the chunk (i64)

  void set_ids(const KvTable& kv, const std::vector<int64_t>& ids) {
    std::vector<int64_t> pos;
    mine.clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      MT_CHECK(ids[i] >= 0, "embedding checkpoint: kv table '", kv.config().name,
               "': the checkpoint holds the negative id ", ids[i]);
      if (!kv.owns(ids[i])) continue;
      mine.push_back(ids[i]);
      pos.push_back(int64_t(i));
    }
    positions = runtime::from_vector<int64_t>(pos, {int64_t(pos.size())}, with(DType::I64));
    ready = true;
  }
};

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

void add_raw_id_load_pieces(const parallel::EmbeddingBagConfig& c, DType wdtype,
                            const LocalShard* shard,
                            const checkpoint::Index& saved, const std::string& model_prefix,
                            const std::string& optimizer_prefix, CheckpointState& dest) {
  std::map<std::string, Shape> saved_shape;
  for (const auto& ch : saved.chunks) saved_shape.emplace(ch.meta.fqn, ch.meta.global_shape);
  const std::string ids_name = model_prefix + ids_fqn(c.name);
  const std::string wname = model_prefix + weight_fqn(c.name);
  const std::string base = optimizer_prefix + "state." + weight_fqn(c.name) + ".";
  const int64_t dim = c.embedding_dim;
  // N saved rows: sparse (with ids), or a dense table's M rows (ids 0..M-1).
  const bool sparse = saved_shape.count(ids_name) > 0;
  int64_t total = 0;
  if (sparse) {
    total = saved_shape.at(ids_name).at(0);
  } else if (auto w = saved_shape.find(wname); w != saved_shape.end()) {
    total = w->second.at(0);
  } else {
    auto v = saved.values.find(raw_rows_key(optimizer_prefix, c.name));
    if (v == saved.values.end()) {
      // Not in the checkpoint: ask for the weight so that load_checkpoint reports it missing.
      dest.tensors.push_back({wname, runtime::zeros({0, dim}, with(DType::F32)), {0, dim}, {0, 0}});
      return;
    }
    total = std::get<int64_t>(v->second);  // saved with no rows stored
  }
  if (auto w = saved_shape.find(wname); w != saved_shape.end())
    MT_CHECK(w->second == Shape({total, dim}), "embedding table '", c.name,
             "': the checkpoint holds ", wname, " as ", shape_text(w->second), ", expected [",
             total, ", ", dim, "] (", sparse ? "its stored rows" : "the table", " x embedding_dim)");
  const std::vector<Field> fields = fields_of(c);
  for (const Field& f : fields) {
    auto it = saved_shape.find(base + f.name);
    if (it == saved_shape.end()) continue;  // load_checkpoint reports it missing
    const Shape want = f.row_wise ? Shape{total} : Shape{total, dim};
    MT_CHECK(it->second == want, "embedding table '", c.name, "': the checkpoint holds ",
             base + f.name, " as ", shape_text(it->second), ", expected ", shape_text(want),
             f.row_wise && it->second.size() == 2
                 ? " (saved per column shard: a raw-id table loads whole rows' state only)"
                 : "");
  }
  const std::shared_ptr<KvTable> kv = shard ? shard->kv : nullptr;
  const DType sdtype = state_dtype(wdtype);
  if (!saved_shape.count(wname)) {  // saved with no rows stored: the table starts over
    if (kv) kv->clear();
    return;
  }
  if (!kv) {  // no shard here: empty pieces, so this rank's strict checks see every tensor
    if (sparse) dest.tensors.push_back({ids_name, runtime::zeros({0}, with(DType::I64)), {total}, {0}});
    dest.tensors.push_back({wname, runtime::zeros({0, dim}, with(wdtype)), {total, dim}, {0, 0}});
    for (const Field& f : fields)
      dest.tensors.push_back(f.row_wise ? TensorPiece{base + f.name, runtime::zeros({0}, with(sdtype)),
                                                      {total}, {0}}
                                        : TensorPiece{base + f.name,
                                                      runtime::zeros({0, dim}, with(sdtype)),
                                                      {total, dim}, {0, 0}});
    return;
  }
  kv->clear();  // its rows now come only from the checkpoint
  for (int64_t r0 = 0; r0 < total; r0 += kKvChunkRows) {
    const int64_t n = std::min(kKvChunkRows, total - r0);
    auto chunk = std::make_shared<LoadChunk>();
    if (sparse) {
      TensorPiece ids{ids_name, checkpoint::lazy_placeholder({n}, DType::I64), {total}, {r0}};
      ids.consume = [chunk, kv](const Tensor& t) { chunk->set_ids(*kv, t.to_vector<int64_t>()); };
      dest.tensors.push_back(std::move(ids));
    } else {
      std::vector<int64_t> ids(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = r0 + i;
      chunk->set_ids(*kv, ids);
    }
    // field -1: the weight; else state field i. Runs after the chunk's ids piece (load_checkpoint
    // hands pieces over in this order).
    auto write = [chunk, kv, name = c.name](int field, const Tensor& t) {
      MT_CHECK(chunk->ready, "embedding checkpoint: kv table '", name, "': its ids were not ",
               "loaded (excluded?), so its rows cannot be placed");
      if (chunk->mine.empty()) return;
      runtime::NoGradGuard no_grad;
      const Tensor rows = runtime::index_select(t, 0, chunk->positions);
      kv->write_field_ids(chunk->mine, field,
                          rows.dim() == 1 ? rows.reshape({rows.size(0), 1}) : rows);
    };
    TensorPiece w{wname, checkpoint::lazy_placeholder({n, dim}, wdtype), {total, dim}, {r0, 0}};
    w.consume = [write](const Tensor& t) { write(-1, t); };
    dest.tensors.push_back(std::move(w));
    for (const Field& f : fields) {
      const int i = kv_field(*kv, f.name);
      TensorPiece piece =
          f.row_wise
              ? TensorPiece{base + f.name, checkpoint::lazy_placeholder({n}, sdtype), {total}, {r0}}
              : TensorPiece{base + f.name, checkpoint::lazy_placeholder({n, dim}, sdtype),
                            {total, dim}, {r0, 0}};
      piece.consume = [write, i](const Tensor& t) { write(i, t); };
      dest.tensors.push_back(std::move(piece));
    }
  }
}

}  // namespace mt::train::embedding_checkpoint
