// FSDPParam: sharding one parameter and the copies in and out of the group's flat buffers.
#include "parallel/fsdp/fsdp_param.h"

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/kernels/copy.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"

namespace mt::parallel {

using runtime::NoGradGuard;

FSDPParam::FSDPParam(std::string fqn, Tensor* slot, const Tensor& full,
                     std::shared_ptr<DeviceMesh> mesh, int64_t mesh_dim,
                     runtime::DType compute_dtype, int64_t tensor_dim, const OuterSharding* outer)
    : fqn_(std::move(fqn)), slots_{slot}, tensor_dim_(tensor_dim) {
  MT_CHECK(full.dim() >= 1, "fully_shard: parameter '", fqn_,
           "' is 0-D; FSDP shards parameters along a dimension");
  MT_CHECK(tensor_dim_ >= 0 && tensor_dim_ < full.dim(), "fully_shard: parameter '", fqn_,
           "' has ", full.dim(), " dims, so it cannot be sharded along dim ", tensor_dim_);
  MT_CHECK(full.is_floating_point(), "fully_shard: parameter '", fqn_, "' has dtype ", full.dtype(),
           "; FSDP shards floating-point parameters only");
  NoGradGuard no_grad;
  size_ = full.size(tensor_dim_);
  num_shards_ = mesh->size(mesh_dim);
  const ChunkRange chunk = chunk_range(size_, num_shards_, mesh->coordinate(mesh_dim));
  padded_shape_ = full.shape();
  padded_shape_[size_t(tensor_dim_)] = chunk.padded_length;
  padded_shard_numel_ = runtime::numel_of(padded_shape_);

  // A copy on the mesh's device, so the whole parameter's memory goes once the slot holds the
  // shard (and a model built on the host never has to fit on one GPU whole).
  const runtime::Device device = mesh->group(mesh_dim).device();
  const Tensor piece = full.narrow(tensor_dim_, chunk.offset, chunk.length);
  sharded_ = runtime::empty(piece.shape(),
                            full.options().with_device(device).with_requires_grad(false));
  // A parameter built under nn::DeferredInitGuard has no values yet: init_sharded_parameters
  // draws the shard's.
  if (full.storage()->has_memory()) sharded_.copy_(piece);
  sharded_.set_requires_grad(full.requires_grad());
  sharded_.set_name(fqn_);

  if (outer == nullptr) {
    std::vector<Placement> placements(size_t(mesh->ndim()), Replicate{});
    placements[size_t(mesh_dim)] = Shard{tensor_dim_};
    runtime::Shape offset(size_t(full.dim()), 0);
    offset[size_t(tensor_dim_)] = chunk.offset;
    dtensor_ = DTensor{sharded_, std::move(mesh), std::move(placements), full.shape(), offset};
  } else {
    dtensor_ = nested_dtensor(full, *mesh, mesh_dim, *outer);
  }

  unsharded_ =
      runtime::empty(full.shape(), full.options().with_dtype(compute_dtype).with_device(device));
  unsharded_.storage()->release_memory();
  unsharded_.set_requires_grad(full.requires_grad());
  unsharded_.set_name(fqn_);
}

DTensor FSDPParam::nested_dtensor(const Tensor& full, const DeviceMesh& mesh, int64_t mesh_dim,
                                  const OuterSharding& outer) const {
  const DeviceMesh& big = *outer.mesh;
  MT_CHECK(outer.placements.size() == size_t(big.ndim()), "fully_shard: '", fqn_,
           "': the outer sharding has ", outer.placements.size(), " placements for ",
           big.describe());
  const std::string& dim_name = mesh.dim_names()[size_t(mesh_dim)];
  MT_CHECK(big.has_dim(dim_name) && big.size(dim_name) == mesh.size(mesh_dim) &&
               big.coordinate(dim_name) == mesh.coordinate(mesh_dim),
           "fully_shard: '", fqn_, "': FSDP's mesh ", mesh.describe(), " is not a sub-mesh of ",
           "the outer sharding's ", big.describe());
  const int64_t k = big.dim_index(dim_name);
  MT_CHECK(std::holds_alternative<Replicate>(outer.placements[size_t(k)]), "fully_shard: '",
           fqn_, "': the outer sharding already places mesh dim '", dim_name, "' (",
           placement_name(outer.placements[size_t(k)]), "); FSDP shards that one");
  runtime::Shape global = full.shape();
  std::vector<Placement> placements = outer.placements;
  int64_t later_cuts = 1;  // pieces the outer mesh dims after FSDP's cut its dim into first
  for (int64_t j = 0; j < big.ndim(); ++j) {
    if (const auto* s = std::get_if<Shard>(&placements[size_t(j)])) {
      MT_CHECK(s->dim >= 0 && s->dim < full.dim(), "fully_shard: '", fqn_, "': outer ",
               placement_name(*s), " of a ", full.dim(), "-D parameter");
      global[size_t(s->dim)] *= big.size(j);
      if (j > k && s->dim == tensor_dim_) later_cuts *= big.size(j);
    }
  }
  if (!outer.global_shape.empty()) global = outer.global_shape;
  if (later_cuts > 1) {
    placements[size_t(k)] = StridedShard{tensor_dim_, later_cuts};
  } else {
    placements[size_t(k)] = Shard{tensor_dim_};
  }
  const LocalPiece piece = local_piece(global, big, placements);
  MT_CHECK(piece.shape == sharded_.shape(), "fully_shard: '", fqn_, "': the outer placements ",
           "put a piece of shape ", piece.shape, " on this rank but FSDP holds ", sharded_.shape(),
           " (outer shards must split their dims evenly and come before FSDP's mesh dims)");
  return DTensor{sharded_, outer.mesh, std::move(placements), std::move(global), piece.offset};
}

Tensor FSDPParam::padded_view(const Tensor& flat, int64_t start, int64_t valid) const {
  return flat.narrow(0, start, padded_shard_numel_).view(padded_shape_).narrow(tensor_dim_, 0,
                                                                               valid);
}

void FSDPParam::enable_float8_all_gather() {
  MT_CHECK(tensor_dim_ == 0 && unsharded_.dim() == 2 && slots_.size() == 1,
           "FSDP float8 all-gather: '", fqn_, "' must be a 2-D weight sharded on dim 0 and held ",
           "by one module");
  float8_all_gather_ = true;
}

void FSDPParam::add_tied_slot(Tensor* slot) {
  float8_all_gather_ = false;  // another module reads it in its own precision
  *slot = *slots_.front();
  slots_.push_back(slot);
}

void FSDPParam::free_unsharded() const {
  unsharded_.set_grad(Tensor());
  unsharded_.storage()->release_memory();
}

void FSDPParam::copy_in(const Tensor& flat) const {
  NoGradGuard no_grad;
  padded_view(flat, 0, sharded_.size(tensor_dim_)).copy_(sharded_);
}

void FSDPParam::copy_out(const Tensor& gathered, int64_t rank_stride, int64_t offset) const {
  // The copy kernel itself, not Tensor::copy_: the same parameter values again, so tensors saved
  // for backward must not see a new version.
  copy_out_into(gathered, rank_stride, offset, unsharded_, [](const Tensor& src, Tensor& dst) {
    runtime::copy_kernel(dst.device(), src, dst);
  });
}

void FSDPParam::copy_out_into(const Tensor& gathered, int64_t rank_stride, int64_t offset,
                              const Tensor& dst, const PieceCopy& copy) const {
  MT_CHECK(gathered.dtype() == dst.dtype() && gathered.is_contiguous() &&
               dst.shape() == unsharded_.shape(),
           "FSDPParam::copy_out: '", fqn_, "' expected a contiguous ", dst.dtype(),
           " buffer and a destination of shape ", unsharded_.shape());
  for (int64_t r = 0; r < num_shards_; ++r) {
    const ChunkRange chunk = chunk_range(size_, num_shards_, r);
    if (chunk.length == 0) continue;
    Tensor piece = dst.narrow(tensor_dim_, chunk.offset, chunk.length);
    copy(padded_view(gathered, r * rank_stride + offset, chunk.length), piece);
  }
}

void FSDPParam::copy_grad_in(const Tensor& grad, const Tensor& flat, int64_t rank_stride,
                             int64_t offset) const {
  NoGradGuard no_grad;
  for (int64_t r = 0; r < num_shards_; ++r) {
    const ChunkRange chunk = chunk_range(size_, num_shards_, r);
    if (chunk.length == 0) continue;
    padded_view(flat, r * rank_stride + offset, chunk.length)
        .copy_(grad.narrow(tensor_dim_, chunk.offset, chunk.length));
  }
}

void FSDPParam::accumulate_sharded_grad(const Tensor& reduced, int64_t offset) const {
  add_to_sharded_grad(padded_view(reduced, offset, sharded_.size(tensor_dim_)));
}

void FSDPParam::add_to_sharded_grad(const Tensor& reduced) const {
  NoGradGuard no_grad;
  const Tensor g =
      reduced.dtype() != sharded_.dtype() ? reduced.to(sharded_.dtype()) : reduced.contiguous();
  const Tensor existing = sharded_.grad();
  if (existing.defined()) {
    runtime::add_(existing, g);
  } else {
    sharded_.set_grad(g);
  }
}

void FSDPParam::accumulate_whole_grad(const Tensor& reduced, double scale) const {
  MT_CHECK(num_shards_ == 1 && reduced.shape() == sharded_.shape(),
           "FSDPParam::accumulate_whole_grad: '", fqn_, "' has ", num_shards_,
           " shards of shape ", sharded_.shape(), ", gradient ", reduced.shape());
  NoGradGuard no_grad;
  if (scale != 1.0) runtime::mul_(reduced, scale);
  add_to_sharded_grad(reduced);
}

}  // namespace mt::parallel
