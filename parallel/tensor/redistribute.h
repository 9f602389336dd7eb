// Redistribution of DTensors between placements, and the boundary to local tensors, with autograd.
//
//   DTensor x = from_local(h, tp_mesh, {Shard{1}});       // h: this rank's [B, T/tp, D]
//   DTensor full = redistribute(x, {Replicate{}});         // all-gather; backward: reduce-scatter
//   Tensor local = to_local(full, {Partial{}});            // consumers give partial gradients
//
// Gradient forms. Every DTensor carries `grad_placements`: the form in which its producer's
// backward needs the DTensor's gradient. A Shard's gradient is the same shard; a Partial(sum)
// tensor's gradient is the whole gradient on every rank (Replicate); a Replicate tensor's gradient
// may come either whole on every rank (Replicate) or as a partial sum (Partial(sum)) — the latter
// is what a local kernel gives when it computes with a replicated input beside sharded ones (a
// column-wise matmul's input gradient), and what DTensor ops (dtensor_ops.h) produce by
// default, so their local kernels' backward formulas hold without any communication. Every
// consumer delivers its gradient in its own form and a conversion (itself a redistribution,
// planned like the forward one) is inserted where the forms differ: the backward of an
// all-gather is a reduce-scatter, of Replicate -> Shard (whole gradients) an all-gather, of a
// partial sum's all-reduce an identity, of Partial -> Shard an all-gather, of a change of shard
// dim the reverse all-to-all. Gradients through Partial(avg | max | min) are refused.
//
// Planning (plan_redistribute). Per tensor dim, the cuts that current and target placements
// share (same mesh dims, in the same order: placement.h) stay; the current ones after them are
// undone last to first (all-gather, or a local zero-padding when the target is Partial(sum)), and
// the target's are applied first to last (a local chunk from Replicate, a reduce-scatter from
// Partial); a shard that only changes its tensor dim on one mesh dim is one all-to-all.
// Partial -> Replicate all-reduces run where the tensor is smallest (before the gathers or after
// the chunks). Every choice is made from shapes alone (padded chunk sizes), the same on every
// rank. Partial -> Partial of another op is refused: sum and avg pieces are not interchangeable
// without scaling each rank's value by the group size (which rounds), and max/min pieces have
// no sum.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallel/mesh/dtensor.h"

namespace mt::parallel {

enum class RedistributeKind {
  AllGather,       // Shard -> Replicate
  ReduceScatter,   // Partial -> Shard
  AllReduce,       // Partial -> Replicate
  AllToAll,        // Shard(d) -> Shard(e)
  Chunk,           // Replicate -> Shard (local)
  PadToPartial,    // Shard -> Partial(sum): the piece in zeros (local)
  ToPartial,       // Replicate -> Partial: the value on coordinate 0, identity elements elsewhere
};
const char* redistribute_kind_name(RedistributeKind kind);

struct RedistributeStep {
  RedistributeKind kind;
  int64_t mesh_dim = 0;
  std::vector<Placement> before, after;  // the whole placement list around this step
  int64_t bytes = 0;  // payload per rank (all-gather: output; others: input); 0 for local steps
};

struct RedistributePlan {
  std::vector<RedistributeStep> steps;
  int64_t bytes() const;
  std::string describe() const;  // "all_gather(dim 0) -> chunk(dim 1)", or "nothing"
};

// The steps from `from` to `to` for a tensor of `global_shape` with elements of `element_size`
// bytes. Throws naming both placement lists when no sound plan exists.
RedistributePlan plan_redistribute(const Shape& global_shape, int64_t element_size,
                                   const DeviceMesh& mesh, const std::vector<Placement>& from,
                                   const std::vector<Placement>& to);

// Runs a plan on this rank's piece (no autograd): collective over the mesh dims it names.
Tensor run_redistribute_plan(const Tensor& local, const Shape& global_shape, const DeviceMesh& mesh,
                             const RedistributePlan& plan, const std::string& name);

// `x` laid out as `to` (differentiable). The result's gradient is expected in `grad_placements`
// (default: the DTensor-op form, see above) and is converted to x.grad_placements in backward.
DTensor redistribute(const DTensor& x, std::vector<Placement> to,
                     std::optional<std::vector<Placement>> grad_placements = std::nullopt,
                     const std::string& name = "dtensor.redistribute");

// A DTensor over this rank's `local` piece (no communication). global_shape defaults to the
// local shape with each Shard dim multiplied by its mesh dim size (even shards); pass it for
// uneven ones (checked: the piece must have the shape local_piece() gives). The code that made
// `local` gets its gradient in `local_grad_placements` (default: whole, as plain single-process
// code expects: Replicate for Replicate and Partial dims).
DTensor from_local(Tensor local, std::shared_ptr<DeviceMesh> mesh, std::vector<Placement> placements,
                   std::optional<Shape> global_shape = std::nullopt,
                   std::optional<std::vector<Placement>> local_grad_placements = std::nullopt);

// This rank's piece. The code using it gives its gradient in `local_grad_placements` (default:
// whole, as above); a conversion to x.grad_placements is recorded when they differ.
Tensor to_local(const DTensor& x,
                std::optional<std::vector<Placement>> local_grad_placements = std::nullopt);

// The gradient forms: of a DTensor op's output (Replicate -> Partial(sum), Partial(sum) ->
// Replicate, shards kept) and of whole gradients (Partial(sum) -> Replicate, others kept).
std::vector<Placement> op_grad_placements(const std::vector<Placement>& placements);
std::vector<Placement> whole_grad_placements(const std::vector<Placement>& placements);

}  // namespace mt::parallel
