// FSDPParam: one parameter under FSDP — its shard on this rank along one tensor dim (the master
// copy the optimizer sees), and the unsharded tensor the module computes with between all-gathers.
//
// - The shard is chunk_range(size(dim), n, rank) of the tensor dim `dim` (0 by default; routed
//   experts use 1 when there are fewer experts than ranks to shard them over). Every rank puts
//   ceil(size / n) slices into the group's flat buffers (`padded_shape`) so the pieces are equal;
//   `sharded` is a contiguous leaf of the valid slices only (possibly none), with the DTensor that
//   describes it.
// - With an OuterSharding (expert parallelism) `full` is itself this rank's piece of a larger
//   tensor, sharded over other dims of a larger mesh: the DTensor is placed on that mesh, with
//   FSDP's Shard nested after the outer placements (mesh-dimension order), so checkpoints and
//   gradient clipping see global coordinates and every mesh dimension the parameter spans.
// - `unsharded` is a leaf of the full shape in the compute dtype whose storage is released while
//   resharded: autograd keeps referring to the same tensor across the forward and backward
//   all-gathers. Copies into it bypass the version counter, as the data is the same parameter.
// - Tied weights (one tensor in several module slots, e.g. Llama's embedding table and output
//   projection) are one FSDPParam holding every slot: one shard, one gather, one gradient (the
//   sum of both uses, accumulated by autograd on the one unsharded leaf).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/mesh/dtensor.h"
#include "runtime/core/tensor.h"

namespace mt::parallel {

// A parameter already sharded before FSDP (expert parallelism): the mesh its DTensor lives on
// (FSDP's mesh is a sub-mesh of it, matched by dimension names) and its placements there, with
// Replicate on the dims FSDP shards. Outer Shard placements must divide their tensor dim evenly.
// Tensor parallelism splits before FSDP too, on an inner mesh dim (tp): FSDP's cut of the same
// tensor dim then applies after it, out of mesh order (a StridedShard, placement.h).
struct OuterSharding {
  std::shared_ptr<DeviceMesh> mesh;
  std::vector<Placement> placements;
  // The whole tensor's shape; empty: the piece's with each outer Shard dim multiplied by its mesh
  // dim size (even splits).
  runtime::Shape global_shape = {};
};

class FSDPParam {
 public:
  // Shards `full` (this rank's copy of the parameter, on any device) over mesh dim `mesh_dim`
  // along tensor dim `tensor_dim`, onto the device of that dim's group (a CUDA device for NCCL);
  // placements: Shard(tensor_dim) on that mesh dim, Replicate on the others (and the outer
  // placements, when given).
  FSDPParam(std::string fqn, Tensor* slot, const Tensor& full, std::shared_ptr<DeviceMesh> mesh,
            int64_t mesh_dim, runtime::DType compute_dtype, int64_t tensor_dim = 0,
            const OuterSharding* outer = nullptr);

  const std::string& fqn() const { return fqn_; }
  // Another module slot holding the same tensor (tied): it is swapped with the first.
  void add_tied_slot(Tensor* slot);
  const Tensor& sharded() const { return sharded_; }
  const Tensor& unsharded() const { return unsharded_; }
  const DTensor& dtensor() const { return dtensor_; }
  runtime::DType compute_dtype() const { return unsharded_.dtype(); }

  int64_t padded_shard_numel() const { return padded_shard_numel_; }  // per-rank flat size
  int64_t tensor_dim() const { return tensor_dim_; }

  // FSDP's float8 all-gather (fully_shard's float8_all_gather): this parameter, the weight of a
  // float8 linear sharded on dim 0, travels as e4m3 codes (FSDPParamGroup::unshard), and its
  // unsharded tensor is never filled: float8_linear reads the registered codes instead. A tied
  // parameter (read by another module in its own precision) never does.
  void enable_float8_all_gather();
  bool float8_all_gather() const { return float8_all_gather_; }

  void use_sharded() const {
    for (Tensor* s : slots_) *s = sharded_;
  }
  void use_unsharded() const {
    for (Tensor* s : slots_) *s = unsharded_;
  }

  // Storage of the unsharded tensor: allocate (contents undefined) / release.
  void alloc_unsharded() const { unsharded_.storage()->restore_memory(); }
  void free_unsharded() const;
  bool is_unsharded_allocated() const { return unsharded_.storage()->has_memory(); }

  // Writes this rank's shard, cast to `flat`'s dtype, into flat[0, padded_shard_numel()) laid
  // out as the padded shard (padding slices left as they are: nothing reads them back).
  void copy_in(const Tensor& flat) const;
  // Fills `unsharded` from the all-gather output: rank r's piece starts at r * rank_stride +
  // offset elements of `gathered` (compute dtype, contiguous).
  void copy_out(const Tensor& gathered, int64_t rank_stride, int64_t offset) const;
  // The same into `dst` (of the full shape and gathered's dtype), each rank's piece moved by
  // copy(src, dst) (the float8 codes: byte for byte).
  using PieceCopy = std::function<void(const Tensor& src, Tensor& dst)>;
  void copy_out_into(const Tensor& gathered, int64_t rank_stride, int64_t offset,
                     const Tensor& dst, const PieceCopy& copy) const;
  // Where this rank's shard goes in an all-gather input `flat` (any dtype): its valid slices of
  // the padded shard laid out at flat[0, padded_shard_numel()).
  Tensor shard_view(const Tensor& flat) const {
    return padded_view(flat, 0, sharded_.size(tensor_dim_));
  }
  // Writes the unsharded gradient, cast to `flat`'s dtype, into the reduce-scatter input: rank r's
  // slices at r * rank_stride + offset (padding left as is).
  void copy_grad_in(const Tensor& grad, const Tensor& flat, int64_t rank_stride,
                    int64_t offset) const;
  // Adds (or sets) this rank's reduced gradient: `reduced` elements [offset, offset + valid).
  void accumulate_sharded_grad(const Tensor& reduced, int64_t offset) const;

  // One shard (a mesh dim of size 1), where the collectives are copies and the shard is the
  // whole parameter, so the group casts the shard straight into the unsharded tensor and the
  // unsharded gradient straight into a reduce-dtype tensor (all of a group's at once): this adds
  // that reduced gradient, multiplied by `scale` (unless 1), to the shard's (or sets it). The
  // same values as the flat-buffer path, without its copies.
  void accumulate_whole_grad(const Tensor& reduced, double scale) const;

 private:
  void add_to_sharded_grad(const Tensor& reduced) const;  // cast to the shard's dtype
  std::string fqn_;
  std::vector<Tensor*> slots_;  // the first, then tied ones
  DTensor nested_dtensor(const Tensor& full, const DeviceMesh& mesh, int64_t mesh_dim,
                         const OuterSharding& outer) const;
  // The `valid` leading slices of the padded shard laid out in flat[start, + padded numel).
  Tensor padded_view(const Tensor& flat, int64_t start, int64_t valid) const;

  int64_t tensor_dim_ = 0, size_ = 0, num_shards_ = 1, padded_shard_numel_ = 0;
  runtime::Shape padded_shape_;
  bool float8_all_gather_ = false;
  Tensor sharded_, unsharded_;
  DTensor dtensor_;
};

}  // namespace mt::parallel
