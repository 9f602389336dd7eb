// DTensor: local pieces, distribute and full_tensor.
#include "parallel/mesh/dtensor.h"

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"

namespace mt::parallel {

namespace {

void check_placements(const Shape& shape, const DeviceMesh& mesh,
                      const std::vector<Placement>& placements) {
  MT_CHECK(int64_t(placements.size()) == mesh.ndim(), "DTensor: ", mesh.describe(), " needs ",
           mesh.ndim(), " placements, got ", placements.size());
  for (const Placement& p : placements) {
    if (const auto d = sharded_dim(p)) {
      MT_CHECK(*d >= 0 && *d < int64_t(shape.size()), "DTensor: ", placement_name(p),
               " is out of range for a tensor of shape ", detail::concat(shape));
    }
  }
}

}  // namespace

std::vector<int64_t> shard_order(const DeviceMesh& mesh, const std::vector<Placement>& placements) {
  MT_CHECK(int64_t(placements.size()) == mesh.ndim(), "DTensor: ", mesh.describe(), " needs ",
           mesh.ndim(), " placements, got ", placements.size());
  std::vector<int64_t> order;
  for (size_t i = 0; i < placements.size(); ++i)
    if (std::holds_alternative<Shard>(placements[i])) order.push_back(int64_t(i));
  for (size_t i = 0; i < placements.size(); ++i) {
    const auto* s = std::get_if<StridedShard>(&placements[i]);
    if (s == nullptr) continue;
    int64_t later = 1;
    for (size_t j = i + 1; j < placements.size(); ++j)
      if (const auto* t = std::get_if<Shard>(&placements[j]); t && t->dim == s->dim)
        later *= mesh.size(int64_t(j));
    MT_CHECK(later == s->split_factor && later > 1, "DTensor: ", placement_name(*s),
             " on mesh dim ", i, " of ", mesh.describe(), " in ", placements_name(placements),
             ": the later mesh dims cut tensor dim ", s->dim, " into ", later,
             " pieces first, so split_factor must be ", later,
             later == 1 ? " (a StridedShard needs a later Shard of the same dim; use Shard)" : "");
    order.push_back(int64_t(i));
  }
  return order;
}

std::vector<int64_t> sizes_before_cut(const Shape& global, const DeviceMesh& mesh,
                                      const std::vector<Placement>& placements) {
  check_placements(global, mesh, placements);
  Shape cur = global;
  std::vector<int64_t> before(placements.size(), 0);
  for (int64_t i : shard_order(mesh, placements)) {
    const size_t d = size_t(*sharded_dim(placements[size_t(i)]));
    before[size_t(i)] = cur[d];
    cur[d] = chunk_range(cur[d], mesh.size(i), mesh.coordinate(i)).length;
  }
  return before;
}

LocalPiece local_piece(const Shape& global_shape, const DeviceMesh& mesh,
                       const std::vector<Placement>& placements) {
  check_placements(global_shape, mesh, placements);
  LocalPiece piece{global_shape, Shape(global_shape.size(), 0)};
  for (int64_t i : shard_order(mesh, placements)) {
    const size_t d = size_t(*sharded_dim(placements[size_t(i)]));
    const ChunkRange r = chunk_range(piece.shape[d], mesh.size(i), mesh.coordinate(i));
    piece.offset[d] += r.offset;
    piece.shape[d] = r.length;
  }
  return piece;
}

DTensor distribute_tensor(const Tensor& global, std::shared_ptr<DeviceMesh> mesh,
                          std::vector<Placement> placements) {
  MT_CHECK(mesh != nullptr, "distribute_tensor: the mesh is null");
  runtime::NoGradGuard no_grad;
  const LocalPiece piece = local_piece(global.shape(), *mesh, placements);
  Tensor local = global;
  for (size_t d = 0; d < piece.shape.size(); ++d) {
    local = local.narrow(int64_t(d), piece.offset[d], piece.shape[d]);
  }
  local = local.clone();
  for (size_t i = 0; i < placements.size(); ++i) {
    if (std::holds_alternative<Partial>(placements[i]) && mesh->coordinate(int64_t(i)) != 0) {
      local.zero_();
    }
  }
  return DTensor{local, std::move(mesh), std::move(placements), global.shape(), piece.offset};
}

Tensor DTensor::full_tensor() const {
  MT_CHECK(mesh != nullptr && local.defined(), "DTensor::full_tensor: undefined DTensor");
  runtime::NoGradGuard no_grad;
  const std::vector<int64_t> before = sizes_before_cut(global_shape, *mesh, placements);
  Tensor cur = local.contiguous();
  for (size_t i = 0; i < placements.size(); ++i) {
    if (const auto* p = std::get_if<Partial>(&placements[i])) {
      cur = cur.clone();
      mesh->group(int64_t(i)).all_reduce(cur, p->op, "dtensor.full_tensor");
    }
  }
  // Undo the cuts last to first.
  const std::vector<int64_t> order = shard_order(*mesh, placements);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const int64_t i = *it;
    cur = gather_shards(mesh->group(i), cur, *sharded_dim(placements[size_t(i)]),
                        before[size_t(i)], "dtensor.full_tensor");
  }
  return cur;
}

Tensor gather_shards(ProcessGroup& group, const Tensor& piece, int64_t dim, int64_t size,
                     const std::string& name) {
  const int64_t n = group.size();
  const int64_t padded = chunk_range(size, n, 0).padded_length;
  Tensor rows = piece.transpose(0, dim).contiguous();  // the sharded dim first
  Shape padded_shape = rows.shape();
  padded_shape[0] = padded;
  Tensor in = runtime::zeros(padded_shape, rows.options().with_requires_grad(false));
  if (rows.size(0) > 0) in.narrow(0, 0, rows.size(0)).copy_(rows);
  padded_shape[0] = padded * n;
  Tensor out = runtime::empty(padded_shape, in.options());
  group.all_gather_into(out, in, name);
  // Drop each chunk's padding: chunk j's valid rows are its first length_j rows.
  std::vector<Tensor> pieces;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t len = chunk_range(size, n, j).length;
    if (len > 0) pieces.push_back(out.narrow(0, j * padded, len));
  }
  Tensor gathered = pieces.empty() ? out.narrow(0, 0, 0) : runtime::cat(pieces, 0);
  return gathered.transpose(0, dim).contiguous();
}

std::string DTensor::describe() const {
  return detail::concat("DTensor(shape ", global_shape, ", ",
                        mesh ? mesh->describe() : std::string("no mesh"), ", ",
                        placements_name(placements), ")");
}

}  // namespace mt::parallel
