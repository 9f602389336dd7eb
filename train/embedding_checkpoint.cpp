// Checkpoint pieces of a ShardedEmbeddingBagCollection (see embedding_checkpoint.h).
#include "train/embedding_checkpoint.h"
#include "train/embedding_checkpoint_detail.h"

#include <map>
#include <sstream>

#include "checkpoint/distributed_checkpoint.h"
#include "parallel/comm/object_collectives.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/matmul.h"

namespace mt::train {

using checkpoint::CheckpointState;
using checkpoint::TensorPiece;
using parallel::LocalShard;
using parallel::ParameterSharding;
using parallel::ShardingType;
using runtime::DType;
using runtime::Shape;
using runtime::Tensor;
using runtime::sparse::EmbOptimType;

namespace embedding_checkpoint {

namespace {

// The fused optimizer's state fields of a table (fused_optimizer.h).
std::vector<Field> fields_of(EmbOptimType type) {
  switch (type) {
    case EmbOptimType::SGD:
      return {};
    case EmbOptimType::RowwiseAdagrad:
      return {{"momentum1", true}};
    case EmbOptimType::Adam:
      return {{"momentum1", false}, {"momentum2", false}};
    case EmbOptimType::PartialRowwiseAdam:
      return {{"momentum1", false}, {"momentum2", true}};
  }
  MT_FAIL("embedding checkpoint: unknown optimizer type ", int(type));
}

}  // namespace

std::vector<Field> fields_of(const parallel::EmbeddingBagConfig& c) {
  return c.update == runtime::sparse::TableUpdate::Train ? fields_of(c.optimizer.type)
                                                        : std::vector<Field>{};
}

std::string weight_fqn(const std::string& table) { return "embedding_bags." + table + ".weight"; }
std::string ids_fqn(const std::string& table) { return "embedding_bags." + table + ".ids"; }

int kv_field(const runtime::sparse::KvTable& kv, const std::string& name) {
  const auto& fields = kv.state_fields();
  for (size_t i = 0; i < fields.size(); ++i)
    if (fields[i].first == name) return int(i);
  MT_FAIL("embedding checkpoint: kv table '", kv.config().name, "' keeps no ", name);
}

}  // namespace embedding_checkpoint

using namespace embedding_checkpoint;

namespace {

// Column bounds of a column_wise table's shards, in column order: "0,c1,...,dim".
std::vector<int64_t> column_bounds(const ParameterSharding& p) {
  std::map<int64_t, int64_t> cols;  // offset -> width
  for (const auto& s : p.shards) cols[s.col_offset] = s.num_cols;
  std::vector<int64_t> out;
  for (const auto& [offset, width] : cols) {
    if (out.empty()) out.push_back(offset);
    out.push_back(offset + width);
  }
  return out;
}

// The column shard index (in column order) of the shard starting at `col_offset`.
int64_t column_index(const std::vector<int64_t>& bounds, int64_t col_offset) {
  for (size_t k = 0; k + 1 < bounds.size(); ++k)
    if (bounds[k] == col_offset) return int64_t(k);
  MT_FAIL("embedding checkpoint: no column shard starts at column ", col_offset);
}

std::string join(const std::vector<int64_t>& v) {
  std::ostringstream s;
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  return s.str();
}

std::vector<int64_t> parse_bounds(const std::string& text, const std::string& key) {
  std::vector<int64_t> out;
  std::stringstream s(text);
  std::string part;
  while (std::getline(s, part, ',')) {
    try {
      out.push_back(std::stoll(part));
    } catch (const std::exception&) {
      MT_FAIL("embedding checkpoint: value ", key, " = \"", text,
              "\" is not a comma-separated list of columns");
    }
  }
  return out;
}

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

const parallel::EmbeddingBagConfig& config_of(const parallel::ShardedEmbeddingBagCollection& ebc,
                                              const std::string& table) {
  for (const auto& c : ebc.table_configs())
    if (c.name == table) return c;
  MT_FAIL("embedding checkpoint: no config for table '", table, "'");
}

const LocalShard* shard_of(const std::vector<LocalShard>& shards, const std::string& table) {
  for (const LocalShard& s : shards)
    if (s.table == table) return &s;
  return nullptr;
}

// A kv shard's weight and state as streamed pieces of kKvChunkRows rows, each read from the
// store view taken now (after flush_kv) when the writer gets to it.
void add_kv_pieces(const LocalShard& s, const ParameterSharding& p,
                   const std::vector<Field>& fields, const std::string& weight_name,
                   const std::string& state_base, CheckpointState& state) {
  const std::shared_ptr<runtime::sparse::KvTable> kv = s.kv;
  const std::shared_ptr<const runtime::sparse::KvStore::View> view = kv->store().view();
  const Shape global{s.global_shape[0], s.global_shape[1]};
  const int64_t rows = s.placement.num_rows, cols = s.placement.num_cols;
  const runtime::DType dtype = kv->dtype();
  const runtime::DType state_dtype = dtype == DType::F64 ? DType::F64 : DType::F32;
  for (int64_t r0 = 0; r0 < rows; r0 += kKvChunkRows) {
    const int64_t n = std::min(kKvChunkRows, rows - r0);
    const int64_t row = s.placement.row_offset + r0;
    // field -1: the weight; else state field i.
    auto produce = [kv, view, r0, n, dtype, state_dtype](int field) {
      const Tensor w = runtime::empty({n, kv->local_cols()},
                                      runtime::TensorOptions{}.with_dtype(dtype));
      std::vector<Tensor> st;
      for (const auto& [name, width] : kv->state_fields())
        st.push_back(runtime::empty({n, width}, runtime::TensorOptions{}.with_dtype(state_dtype)));
      kv->read_rows(r0, n, w, st, view.get());
      return field < 0 ? w : st[size_t(field)];
    };
    TensorPiece wp{weight_name, checkpoint::lazy_placeholder({n, cols}, dtype), global,
                   {row, s.placement.col_offset}};
    wp.produce = [produce] { return produce(-1); };
    state.tensors.push_back(std::move(wp));
    for (const Field& f : fields) {
      const int i = kv_field(*kv, f.name);
      TensorPiece piece{state_base + f.name, Tensor(), global, {row, s.placement.col_offset}};
      if (!f.row_wise) {
        piece.local = checkpoint::lazy_placeholder({n, cols}, state_dtype);
        piece.produce = [produce, i] { return produce(i); };
      } else if (s.type == ShardingType::ColumnWise) {
        const std::vector<int64_t> bounds = column_bounds(p);
        piece.local = checkpoint::lazy_placeholder({n, 1}, state_dtype);
        piece.global_shape = {global[0], int64_t(bounds.size()) - 1};
        piece.global_offset = {row, column_index(bounds, s.placement.col_offset)};
        piece.produce = [produce, i] { return produce(i); };
      } else {
        piece.local = checkpoint::lazy_placeholder({n}, state_dtype);
        piece.global_shape = {global[0]};
        piece.global_offset = {row};
        piece.produce = [produce, i, n] { return produce(i).view({n}); };
      }
      state.tensors.push_back(std::move(piece));
    }
  }
}

}  // namespace

void add_embedding_pieces(const parallel::ShardedEmbeddingBagCollection& ebc,
                          const std::string& model_prefix, const std::string& optimizer_prefix,
                          CheckpointState& state) {
  const runtime::nn::StateDict opt = ebc.optimizer_state_dict();
  const_cast<parallel::ShardedEmbeddingBagCollection&>(ebc).flush_kv();
  for (const LocalShard& s : ebc.local_shards()) {
    const Shape global{s.global_shape[0], s.global_shape[1]};
    const Shape offset{s.placement.row_offset, s.placement.col_offset};
    const int64_t rows = s.placement.num_rows;
    const ParameterSharding& p = ebc.plan().at(s.table);
    const std::string base = optimizer_prefix + "state." + s.fqn + ".";
    if (s.kv) {
      if (!s.kv->raw_ids())  // raw-id tables: add_raw_id_pieces below
        add_kv_pieces(s, p, fields_of(config_of(ebc, s.table)), model_prefix + s.fqn, base, state);
      state.tensors.push_back(checkpoint::whole(base + "step", opt.at(s.fqn + ".step")));
      continue;
    }
    state.tensors.push_back({model_prefix + s.fqn, s.weight.detach(), global, offset});
    for (const Field& f : fields_of(config_of(ebc, s.table))) {
      const Tensor t = opt.at(s.fqn + "." + f.name);
      if (!f.row_wise) {
        state.tensors.push_back({base + f.name, t, global, offset});
      } else if (s.type == ShardingType::ColumnWise) {
        const std::vector<int64_t> bounds = column_bounds(p);
        const int64_t k = column_index(bounds, s.placement.col_offset);
        state.tensors.push_back(
            {base + f.name, t, {global[0], int64_t(bounds.size()) - 1}, {0, k}});
      } else {
        state.tensors.push_back({base + f.name, t.view({rows}), {global[0]}, {offset[0]}});
      }
    }
    state.tensors.push_back(checkpoint::whole(base + "step", opt.at(s.fqn + ".step")));
  }
  add_raw_id_pieces(ebc, model_prefix, optimizer_prefix, state);
  // The column splits, known to every rank (rank 0 writes the values, holder or not).
  for (const auto& c : ebc.table_configs()) {
    const ParameterSharding& p = ebc.plan().at(c.name);
    if (p.type != ShardingType::ColumnWise) continue;
    state.values[optimizer_prefix + "state." + weight_fqn(c.name) + ".column_bounds"] =
        join(column_bounds(p));
  }
}

namespace {

// The field of a row-state tensor as loaded ([n], [n, 1] or [n, K] saved per column shard) as
// the shard keeps it: [n, 1].
Tensor row_state(const Tensor& t, EmbeddingLoadPlan::Kind kind,
                 const std::vector<int64_t>& saved_column_bounds) {
  if (kind != EmbeddingLoadPlan::Kind::RowFromColumns) return t.reshape({t.size(0), 1});
  // sum_k m_k * width_k / dim: the whole row's accumulated mean of squares.
  const std::vector<int64_t>& b = saved_column_bounds;
  const int64_t K = int64_t(b.size()) - 1;
  std::vector<double> w(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) w[size_t(k)] = double(b[k + 1] - b[k]) / double(b.back());
  return runtime::matmul(
      t, runtime::from_vector<double>(w, {K, 1}, runtime::TensorOptions{}.with_dtype(t.dtype())));
}

// A kv shard's piece `local` (the shard's rows along dim 0, at goffset) as streamed pieces of
// kKvChunkRows rows, each written into the store as soon as it is read. The weight's call
// empties the shard first (its rows then come only from the checkpoint).
void add_kv_load_pieces(const std::shared_ptr<runtime::sparse::KvTable>& kv,
                        EmbeddingLoadPlan::Kind kind, const std::string& name,
                        const std::string& key, const Tensor& local, const Shape& gshape,
                        const Shape& goffset, const std::vector<int64_t>& bounds,
                        CheckpointState& dest) {
  using Kind = EmbeddingLoadPlan::Kind;
  const int field =
      kind == Kind::Weight ? -1 : kv_field(*kv, key.substr(key.rfind('.') + 1));
  if (kind == Kind::Weight) kv->clear();
  const int64_t rows = local.size(0);
  for (int64_t r0 = 0; r0 < rows; r0 += kKvChunkRows) {
    const int64_t n = std::min(kKvChunkRows, rows - r0);
    Shape shape = local.shape();
    shape[0] = n;
    Shape offset = goffset;
    offset[0] += r0;
    TensorPiece piece{name, checkpoint::lazy_placeholder(shape, local.dtype()), gshape, offset};
    piece.consume = [kv, kind, field, r0, bounds](const Tensor& t) {
      runtime::NoGradGuard no_grad;
      kv->write_field(r0, field,
                      field < 0 || kind == Kind::Element ? t : row_state(t, kind, bounds));
    };
    dest.tensors.push_back(std::move(piece));
  }
}

}  // namespace

void add_kv_row_counts(const parallel::ShardedEmbeddingBagCollection& ebc,
                       const std::string& optimizer_prefix, CheckpointState& state) {
  std::vector<std::string> kv_tables;
  for (const auto& c : ebc.table_configs())
    if (c.storage == runtime::sparse::TableStorage::Kv) kv_tables.push_back(c.name);
  if (kv_tables.empty()) return;  // the same on every rank: no collective
  const std::vector<LocalShard> shards = ebc.local_shards();
  std::vector<double> mine(kv_tables.size(), 0.0);
  for (size_t t = 0; t < kv_tables.size(); ++t)
    for (const LocalShard& s : shards)
      if (s.table == kv_tables[t] && s.kv) mine[t] += double(s.kv->stored_rows());
  const std::vector<double> all =
      parallel::all_gather_values(ebc.group(), mine, "checkpoint.kv_row_counts");
  for (size_t t = 0; t < kv_tables.size(); ++t) {
    double total = 0;
    for (size_t r = t; r < all.size(); r += kv_tables.size()) total += all[r];
    state.values[optimizer_prefix + "kv_rows." + kv_tables[t]] = int64_t(total);
  }
}

EmbeddingLoadPlan embedding_load_template(const parallel::ShardedEmbeddingBagCollection& ebc,
                                          const checkpoint::Index& saved,
                                          const std::string& model_prefix,
                                          const std::string& optimizer_prefix,
                                          CheckpointState& dest,
                                          const EmbeddingLoadOptions& options) {
  std::map<std::string, Shape> saved_shape;  // fqn -> global shape
  for (const auto& c : saved.chunks) saved_shape.emplace(c.meta.fqn, c.meta.global_shape);
  const std::vector<LocalShard> shards = ebc.local_shards();
  const runtime::TensorOptions fopts = runtime::TensorOptions{}.with_dtype(ebc.options().dtype);
  EmbeddingLoadPlan plan;
  using Kind = EmbeddingLoadPlan::Kind;

  for (const auto& c : ebc.table_configs()) {
    const std::string fqn = weight_fqn(c.name);
    const std::string wname = model_prefix + fqn;
    const Shape global{c.num_embeddings, c.embedding_dim};
    MT_CHECK(c.raw_ids || !saved_shape.count(model_prefix + ids_fqn(c.name)), "embedding table '",
             c.name, "': the checkpoint keys it by raw ids (it holds ", model_prefix,
             ids_fqn(c.name), "); load it into a raw-id kv table (raw_ids)");
    if (auto it = saved_shape.find(wname); !c.raw_ids && it != saved_shape.end()) {
      MT_CHECK(it->second == global, "embedding table '", c.name, "': the checkpoint holds ", wname,
               " as ", shape_str(it->second),
               " (num_embeddings x embedding_dim), this model's table is ", shape_str(global));
    }
    const ParameterSharding& p = ebc.plan().at(c.name);
    const LocalShard* s = shard_of(shards, c.name);
    const int64_t rows = s ? s->placement.num_rows : 0;
    const int64_t cols = s ? s->placement.num_cols : 0;
    const Shape offset = s ? Shape{s->placement.row_offset, s->placement.col_offset} : Shape{0, 0};
    auto add = [&](Kind kind, const std::string& name, const std::string& key, Tensor local,
                   Shape gshape, Shape goffset, std::vector<int64_t> bounds = {}) {
      if (s && s->kv && kind != Kind::Step) {
        add_kv_load_pieces(s->kv, kind, name, key, local, gshape, goffset, bounds, dest);
        return;
      }
      dest.tensors.push_back({name, std::move(local), std::move(gshape), std::move(goffset)});
      if (s) plan.items.push_back({kind, c.name, name, key, rows, std::move(bounds)});
    };

    const std::string base = optimizer_prefix + "state." + fqn + ".";
    if (c.raw_ids) {
      add_raw_id_load_pieces(c, ebc.options().dtype, s, saved, model_prefix, optimizer_prefix, dest);
      add(Kind::Step, base + "step", fqn + ".step",
          runtime::zeros({}, runtime::TensorOptions{}.with_dtype(DType::I64)), {}, {});
      continue;
    }
    add(Kind::Weight, wname, "", runtime::zeros({rows, s ? cols : c.embedding_dim}, fopts), global,
        offset);
    for (const Field& f : fields_of(c)) {
      const std::string name = base + f.name;
      const std::string key = fqn + "." + f.name;
      if (!f.row_wise) {
        add(Kind::Element, name, key, runtime::zeros({rows, s ? cols : c.embedding_dim}, fopts),
            global, offset);
        continue;
      }
      const bool column = p.type == ShardingType::ColumnWise;
      const std::vector<int64_t> bounds = column ? column_bounds(p) : std::vector<int64_t>{};
      auto it = saved_shape.find(name);
      const Shape mine_saved =
          column ? Shape{c.num_embeddings, int64_t(bounds.size()) - 1} : Shape{c.num_embeddings};
      const Shape stored = it == saved_shape.end() ? mine_saved : it->second;
      if (stored.size() == 1) {
        MT_CHECK(stored[0] == c.num_embeddings, "embedding table '", c.name, "': ", name,
                 " is saved as ", shape_str(stored), ", expected [", c.num_embeddings, "]");
        MT_CHECK(!column || options.approximate_row_state, "embedding table '", c.name, "': ", name,
                 " was saved for whole rows ", shape_str(stored),
                 ", but this plan splits the table into ", bounds.size() - 1,
                 " column shards (columns ", join(bounds),
                 ") whose row-wise state is per shard and unknown; set "
                 "EmbeddingLoadOptions::approximate_row_state to start each shard from the whole "
                 "row's value, or exclude the optimizer state");
        add(Kind::Row, name, key, runtime::zeros({rows}, fopts), stored, {offset[0]});
        continue;
      }
      MT_CHECK(stored.size() == 2 && stored[0] == c.num_embeddings, "embedding table '", c.name,
               "': ", name, " is saved as ", shape_str(stored), ", expected [", c.num_embeddings,
               "] or [", c.num_embeddings, ", column shards]");
      const std::string bounds_key = base + "column_bounds";
      auto bv = saved.values.find(bounds_key);
      MT_CHECK(bv != saved.values.end() && std::holds_alternative<std::string>(bv->second),
               "embedding table '", c.name, "': ", name, " is saved as ", shape_str(stored),
               " without a column split (no string value ", bounds_key,
               "): not the row-wise state of this table's optimizer (",
               runtime::sparse::optimizer_name(c.optimizer.type),
               "); was the checkpoint saved with another optimizer?");
      const std::vector<int64_t> saved_bounds =
          parse_bounds(std::get<std::string>(bv->second), bounds_key);
      MT_CHECK(int64_t(saved_bounds.size()) == stored[1] + 1 && saved_bounds.front() == 0 &&
                   saved_bounds.back() == c.embedding_dim,
               "embedding table '", c.name, "': ", bounds_key, " = ", join(saved_bounds),
               " does not split ", c.embedding_dim, " columns into ", stored[1], " shards");
      if (column && bounds == saved_bounds) {
        const int64_t k = s ? column_index(bounds, s->placement.col_offset) : 0;
        add(Kind::Row, name, key, runtime::zeros({rows, s ? 1 : 0}, fopts), stored, {0, k});
        continue;
      }
      MT_CHECK(!column || options.approximate_row_state, "embedding table '", c.name, "': ", name,
               " was saved per column shard with columns ", join(saved_bounds),
               ", this plan splits the columns as ", join(bounds),
               "; row-wise state cannot be resplit exactly (set "
               "EmbeddingLoadOptions::approximate_row_state to start every shard from the "
               "width-weighted mean, or use the saved split)");
      add(Kind::RowFromColumns, name, key, runtime::zeros({rows, s ? stored[1] : 0}, fopts), stored,
          {offset[0], 0}, saved_bounds);
    }
    add(Kind::Step, base + "step", fqn + ".step",
        runtime::zeros({}, runtime::TensorOptions{}.with_dtype(DType::I64)), {}, {});
  }
  return plan;
}

void apply_loaded_embeddings(parallel::ShardedEmbeddingBagCollection& ebc,
                             const EmbeddingLoadPlan& plan, const CheckpointState& dest,
                             const std::vector<std::string>& exclude) {
  std::map<std::string, const Tensor*> loaded;
  for (const TensorPiece& p : dest.tensors) loaded[p.fqn] = &p.local;
  const std::vector<LocalShard> shards = ebc.local_shards();
  runtime::NoGradGuard no_grad;
  // Starts from the current state: fields the plan does not name (a caller dropped their items,
  // e.g. excluded "optimizer." prefixes) keep their values.
  runtime::nn::StateDict state = ebc.optimizer_state_dict();
  for (const auto& item : plan.items) {
    if (checkpoint::is_excluded(item.name, exclude)) continue;
    auto it = loaded.find(item.name);
    MT_CHECK(it != loaded.end(), "apply_loaded_embeddings: ", item.name,
             " is not in the loaded state (was it built by embedding_load_template?)");
    const Tensor& t = *it->second;
    switch (item.kind) {
      case EmbeddingLoadPlan::Kind::Weight: {
        const LocalShard* s = shard_of(shards, item.table);
        MT_CHECK(s != nullptr, "apply_loaded_embeddings: this rank holds no shard of table '",
                 item.table, "' (the plan changed since embedding_load_template)");
        s->weight.copy_(t);
        s->weight.bump_version();
        break;
      }
      case EmbeddingLoadPlan::Kind::Element:
      case EmbeddingLoadPlan::Kind::Step:
        state.set(item.state_key, t);
        break;
      case EmbeddingLoadPlan::Kind::Row:
      case EmbeddingLoadPlan::Kind::RowFromColumns:
        state.set(item.state_key, row_state(t, item.kind, item.saved_column_bounds));
        break;
    }
  }
  ebc.load_optimizer_state_dict(state);
}

void add_mc_pieces(const std::vector<runtime::sparse::McStatePiece>& pieces,
                   const std::string& prefix, CheckpointState& state) {
  for (const auto& p : pieces) {
    if (p.local.numel() == 0) continue;
    state.tensors.push_back({prefix + p.name, p.local, {p.global_rows}, {p.row_offset}});
  }
}

std::vector<runtime::sparse::McStatePiece> mc_load_pieces(
    const std::vector<runtime::sparse::McStatePiece>& mine, const std::string& prefix,
    CheckpointState& dest) {
  std::vector<runtime::sparse::McStatePiece> out;
  for (const auto& p : mine) {
    Tensor buffer =
        runtime::zeros(p.local.shape(), runtime::TensorOptions{}.with_dtype(DType::I64));
    dest.tensors.push_back({prefix + p.name, buffer, {p.global_rows}, {p.row_offset}});
    out.push_back({p.name, buffer, p.global_rows, p.row_offset});
  }
  return out;
}

}  // namespace mt::train
