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
                     std::shared_ptr<DeviceMesh> mesh, int64_t shard_dim,
                     runtime::DType compute_dtype)
    : fqn_(std::move(fqn)), slot_(slot) {
  MT_CHECK(full.dim() >= 1, "fully_shard: parameter '", fqn_,
           "' is 0-D; FSDP shards parameters along dim 0");
  MT_CHECK(full.is_floating_point(), "fully_shard: parameter '", fqn_, "' has dtype ", full.dtype(),
           "; FSDP shards floating-point parameters only");
  NoGradGuard no_grad;
  rows_ = full.size(0);
  row_numel_ = 1;
  for (int64_t d = 1; d < full.dim(); ++d) row_numel_ *= full.size(d);
  num_shards_ = mesh->size(shard_dim);
  const ChunkRange chunk = chunk_range(rows_, num_shards_, mesh->coordinate(shard_dim));

  runtime::Shape padded_shape = full.shape();
  padded_shape[0] = chunk.padded_length;
  padded_shard_ = runtime::zeros(padded_shape, full.options());
  if (chunk.length > 0) {
    padded_shard_.narrow(0, 0, chunk.length).copy_(full.narrow(0, chunk.offset, chunk.length));
  }
  sharded_ = padded_shard_.narrow(0, 0, chunk.length).detach();
  sharded_.set_requires_grad(full.requires_grad());
  sharded_.set_name(fqn_);

  std::vector<Placement> placements(size_t(mesh->ndim()), Replicate{});
  placements[size_t(shard_dim)] = Shard{0};
  runtime::Shape offset(size_t(full.dim()), 0);
  offset[0] = chunk.offset;
  dtensor_ = DTensor{sharded_, std::move(mesh), std::move(placements), full.shape(), offset};

  unsharded_ = runtime::empty(full.shape(), full.options().with_dtype(compute_dtype));
  unsharded_.storage()->release_memory();
  unsharded_.set_requires_grad(full.requires_grad());
  unsharded_.set_name(fqn_);
}

void FSDPParam::free_unsharded() const {
  unsharded_.set_grad(Tensor());
  unsharded_.storage()->release_memory();
}

void FSDPParam::copy_in(const Tensor& flat) const {
  NoGradGuard no_grad;
  flat.narrow(0, 0, padded_shard_numel()).view(padded_shard_.shape()).copy_(padded_shard_);
}

void FSDPParam::copy_out(const Tensor& gathered, int64_t rank_stride, int64_t offset) const {
  MT_CHECK(gathered.dtype() == unsharded_.dtype() && gathered.is_contiguous(),
           "FSDPParam::copy_out: '", fqn_, "' expected a contiguous ", unsharded_.dtype(),
           " buffer");
  const int64_t padded_rows = chunk_range(rows_, num_shards_, 0).padded_length;
  const Tensor dst = unsharded_.reshape({-1});
  for (int64_t r = 0; r < num_shards_; ++r) {
    const int64_t valid = chunk_range(rows_, num_shards_, r).length;
    if (valid == 0) continue;
    // The copy kernel itself, not Tensor::copy_: the same parameter values again, so tensors
    // saved for backward must not see a new version.
    runtime::copy_kernel(dst.device(),
                         gathered.narrow(0, r * rank_stride + offset, valid * row_numel_),
                         dst.narrow(0, r * padded_rows * row_numel_, valid * row_numel_));
  }
}

void FSDPParam::copy_grad_in(const Tensor& grad, const Tensor& flat, int64_t rank_stride,
                             int64_t offset) const {
  NoGradGuard no_grad;
  const Tensor g = grad.reshape({-1});
  const int64_t padded_rows = chunk_range(rows_, num_shards_, 0).padded_length;
  for (int64_t r = 0; r < num_shards_; ++r) {
    const int64_t valid = chunk_range(rows_, num_shards_, r).length;
    if (valid == 0) continue;
    flat.narrow(0, r * rank_stride + offset, valid * row_numel_)
        .copy_(g.narrow(0, r * padded_rows * row_numel_, valid * row_numel_));
  }
}

void FSDPParam::accumulate_sharded_grad(const Tensor& reduced, int64_t offset) const {
  NoGradGuard no_grad;
  Tensor g = reduced.narrow(0, offset, sharded_.numel()).view(sharded_.shape());
  if (g.dtype() != sharded_.dtype()) g = g.to(sharded_.dtype());
  const Tensor existing = sharded_.grad();
  if (existing.defined()) {
    runtime::add_(existing, g);
  } else {
    sharded_.set_grad(g);
  }
}

}  // namespace mt::parallel
