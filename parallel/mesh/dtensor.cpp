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
    if (const auto* s = std::get_if<Shard>(&p)) {
      MT_CHECK(s->dim >= 0 && s->dim < int64_t(shape.size()), "DTensor: ", placement_name(p),
               " is out of range for a tensor of shape ", detail::concat(shape));
    }
  }
}

// Sizes along the sharded tensor dim before each mesh dim's shard is applied.
std::vector<int64_t> sizes_before(const Shape& global, const DeviceMesh& mesh,
                                  const std::vector<Placement>& placements) {
  Shape cur = global;
  std::vector<int64_t> before(placements.size(), 0);
  for (size_t i = 0; i < placements.size(); ++i) {
    if (const auto* s = std::get_if<Shard>(&placements[i])) {
      before[i] = cur[size_t(s->dim)];
      cur[size_t(s->dim)] = chunk_range(cur[size_t(s->dim)], mesh.size(int64_t(i)),
                                        mesh.coordinate(int64_t(i)))
                                .length;
    }
  }
  return before;
}

}  // namespace

LocalPiece local_piece(const Shape& global_shape, const DeviceMesh& mesh,
                       const std::vector<Placement>& placements) {
  check_placements(global_shape, mesh, placements);
  LocalPiece piece{global_shape, Shape(global_shape.size(), 0)};
  for (size_t i = 0; i < placements.size(); ++i) {
    if (const auto* s = std::get_if<Shard>(&placements[i])) {
      const size_t d = size_t(s->dim);
      const ChunkRange r =
          chunk_range(piece.shape[d], mesh.size(int64_t(i)), mesh.coordinate(int64_t(i)));
      piece.offset[d] += r.offset;
      piece.shape[d] = r.length;
    }
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
  const std::vector<int64_t> before = sizes_before(global_shape, *mesh, placements);
  Tensor cur = local.contiguous();
  for (size_t i = placements.size(); i-- > 0;) {
    ProcessGroup& group = mesh->group(int64_t(i));
    if (const auto* p = std::get_if<Partial>(&placements[i])) {
      cur = cur.clone();
      group.all_reduce(cur, p->op, "dtensor.full_tensor");
    } else if (const auto* s = std::get_if<Shard>(&placements[i])) {
      const int64_t n = mesh->size(int64_t(i));
      const int64_t padded = chunk_range(before[i], n, 0).padded_length;
      Tensor rows = cur.transpose(0, s->dim).contiguous();  // the sharded dim first
      Shape padded_shape = rows.shape();
      padded_shape[0] = padded;
      Tensor in = runtime::zeros(padded_shape, rows.options());
      in.narrow(0, 0, rows.size(0)).copy_(rows);
      padded_shape[0] = padded * n;
      Tensor out = runtime::empty(padded_shape, rows.options());
      group.all_gather_into(out, in, "dtensor.full_tensor");
      // Drop each chunk's padding: chunk j's valid rows are its first length_j rows.
      std::vector<Tensor> pieces;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t len = chunk_range(before[i], n, j).length;
        if (len > 0) pieces.push_back(out.narrow(0, j * padded, len));
      }
      Tensor gathered = pieces.empty() ? out.narrow(0, 0, 0) : runtime::cat(pieces, 0);
      cur = gathered.transpose(0, s->dim).contiguous();
    }
  }
  return cur;
}

std::string DTensor::describe() const {
  std::string p;
  for (const auto& pl : placements) p += (p.empty() ? "" : ", ") + placement_name(pl);
  return detail::concat("DTensor(shape ", global_shape, ", ",
                        mesh ? mesh->describe() : std::string("no mesh"), ", [", p, "])");
}

}  // namespace mt::parallel
