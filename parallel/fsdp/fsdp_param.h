// FSDPParam: one parameter under FSDP — its dim-0 shard on this rank (the master copy the
// optimizer sees), and the unsharded tensor the module computes with between all-gathers.
//
// - `padded_shard` holds ceil(rows / n) rows (zeros past the parameter's end) so every rank
//   contributes equal-sized pieces to the group's flat all-gather buffer; `sharded` is the leaf
//   parameter over its valid rows (possibly 0 rows), with the DTensor that describes it.
// - `unsharded` is a leaf of the full shape in the compute dtype whose storage is released while
//   resharded: autograd keeps referring to the same tensor across the forward and backward
//   all-gathers. Copies into it bypass the version counter, as the data is the same parameter.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "parallel/mesh/dtensor.h"
#include "runtime/core/tensor.h"

namespace mt::parallel {

class FSDPParam {
 public:
  // Shards `full` (this rank's copy of the whole parameter) over mesh dim `shard_dim`;
  // placements: Shard(0) on that dim, Replicate on the others.
  FSDPParam(std::string fqn, Tensor* slot, const Tensor& full, std::shared_ptr<DeviceMesh> mesh,
            int64_t shard_dim, runtime::DType compute_dtype);

  const std::string& fqn() const { return fqn_; }
  Tensor* slot() const { return slot_; }
  const Tensor& sharded() const { return sharded_; }
  const Tensor& unsharded() const { return unsharded_; }
  const Tensor& padded_shard() const { return padded_shard_; }
  const DTensor& dtensor() const { return dtensor_; }
  runtime::DType compute_dtype() const { return unsharded_.dtype(); }

  int64_t padded_shard_numel() const { return padded_shard_.numel(); }  // per-rank flat size
  int64_t row_numel() const { return row_numel_; }
  int64_t rows() const { return rows_; }

  void use_sharded() const { *slot_ = sharded_; }
  void use_unsharded() const { *slot_ = unsharded_; }

  // Storage of the unsharded tensor: allocate (contents undefined) / release.
  void alloc_unsharded() const { unsharded_.storage()->restore_memory(); }
  void free_unsharded() const;
  bool is_unsharded_allocated() const { return unsharded_.storage()->has_memory(); }

  // Writes this rank's shard, cast to `flat`'s dtype, into flat[0, padded_shard_numel()).
  void copy_in(const Tensor& flat) const;
  // Fills `unsharded` from the all-gather output: rank r's piece starts at r * rank_stride +
  // offset elements of `gathered` (compute dtype, contiguous).
  void copy_out(const Tensor& gathered, int64_t rank_stride, int64_t offset) const;
  // Writes the unsharded gradient, cast to `flat`'s dtype, into the reduce-scatter input: rank r's
  // rows at r * rank_stride + offset (padding left as is).
  void copy_grad_in(const Tensor& grad, const Tensor& flat, int64_t rank_stride,
                    int64_t offset) const;
  // Adds (or sets) this rank's reduced gradient: `reduced` elements [offset, offset + valid).
  void accumulate_sharded_grad(const Tensor& reduced, int64_t offset) const;

 private:
  std::string fqn_;
  Tensor* slot_;
  int64_t rows_ = 0, row_numel_ = 1, num_shards_ = 1;
  Tensor padded_shard_, sharded_, unsharded_;
  DTensor dtensor_;
};

}  // namespace mt::parallel
