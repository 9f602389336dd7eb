// DTensor: a light distributed tensor — this rank's local piece plus the mesh, one placement per
// mesh dimension, and the global shape and offset of the piece. FSDP's sharded parameters,
// gradient clipping and checkpointing read it; it has no ops of its own (compute runs on local
// tensors).
//
// Shards nest in mesh-dimension order, as torch does: with placements (Shard(0), Shard(0)) on a
// 2x2 mesh, dim 0 is chunked over mesh dim 0, and each chunk again over mesh dim 1. `local`
// holds the valid (unpadded) rows only.
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

  // The whole tensor on every rank: gathers shards and reduces partials over the mesh
  // (collective over the mesh). For tests, consolidation and debugging, not the hot path.
  Tensor full_tensor() const;
  std::string describe() const;  // "DTensor(shape [8, 4], DeviceMesh(dp=2), [Shard(0)])"
};

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

}  // namespace mt::parallel
