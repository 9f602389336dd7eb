// DTensor: a light distributed tensor — this rank's local piece plus the mesh, one placement per
// mesh dimension, and the global shape and offset of the piece. FSDP's sharded parameters,
// gradient clipping and checkpointing read it; it has no ops of its own (compute runs on local
// tensors).
//
// Shards nest in mesh-dimension order, as torch does: with placements (Shard(0), Shard(0)) on a
// 2x2 mesh, dim 0 is chunked over mesh dim 0, and each chunk again over mesh dim 1; StridedShard
// cuts come after every plain Shard (placement.h). `local` holds the valid (unpadded) rows only.
// parallel/tensor/ gives DTensors ops, redistribution and autograd.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/mesh/device_mesh.h"
#include "parallel/mesh/placement.h"
#include "runtime/core/tensor.h"

namespace mt::parallel {

using runtime::Shape;

struct DTensor {
  Tensor local;
  std::shared_ptr<DeviceMesh> mesh;
  std::vector<Placement> placements;  // one per mesh dimension
  Shape global_shape;
  Shape local_offset;  // global index of local's first element, per tensor dim
  // The form its producer's backward needs its gradient in (parallel/tensor/redistribute.h);
  // empty: the DTensor-op form. Only autograd code reads it.
  std::vector<Placement> grad_placements = {};

  // The whole tensor on every rank: gathers shards and reduces partials over the mesh
  // (collective over the mesh). For tests, consolidation and debugging, not the hot path.
  Tensor full_tensor() const;
  std::string describe() const;  // "DTensor(shape [8, 4], DeviceMesh(dp=2), [Shard(0)])"
};

// The mesh dims that shard a tensor, in the order their cuts apply: plain Shards in mesh order,
// then StridedShards in mesh order. Throws when a StridedShard's split_factor is not the number
// of pieces the later mesh dims' plain Shards cut its tensor dim into.
std::vector<int64_t> shard_order(const DeviceMesh& mesh, const std::vector<Placement>& placements);

// The size of each sharding mesh dim's tensor dim just before its cut (0 for the others), on
// this rank: what the chunks of that mesh dim split.
std::vector<int64_t> sizes_before_cut(const Shape& global_shape, const DeviceMesh& mesh,
                                      const std::vector<Placement>& placements);

// Where this rank's piece of a `global_shape` tensor lies: its shape and offset.
struct LocalPiece {
  Shape shape;
  Shape offset;
};
LocalPiece local_piece(const Shape& global_shape, const DeviceMesh& mesh,
                       const std::vector<Placement>& placements);

// This rank's piece of `global` (which every rank holds in full): a copy of the valid rows of its
// shards; Partial placements keep the value on coordinate 0 of that mesh dim and zeros elsewhere.
DTensor distribute_tensor(const Tensor& global, std::shared_ptr<DeviceMesh> mesh,
                          std::vector<Placement> placements);

// The whole tensor dim `dim` (of `size` rows) from each rank's torch.chunk piece of it over
// `group` (one padded all-gather, no autograd). Pieces may be uneven or empty.
Tensor gather_shards(ProcessGroup& group, const Tensor& piece, int64_t dim, int64_t size,
                     const std::string& name);

}  // namespace mt::parallel
