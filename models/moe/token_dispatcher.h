// The seam between the MoE experts and expert parallelism. GroupedExperts (models/moe/experts.h)
// calls a TokenDispatcher, when one is set, around its local grouped matmuls; parallel/ (expert
// parallelism) implements it with all-to-alls. models/ never issues a collective itself: a null
// dispatcher means every expert is local and nothing is exchanged.
//
// Contract, per forward call of GroupedExperts:
//   auto [local_x, local_counts] = dispatch(x, counts);   // x grouped by GLOBAL expert id
//   Tensor local_y = <this rank's experts on local_x, grouped by LOCAL expert>;
//   Tensor y = combine(local_y);                           // back in x's row order
// - dispatch gets x [N, dim] whose rows are grouped by global expert id e in
//   [0, n_routed_experts), counts[e] rows each (in order, zeros allowed), and returns the rows
//   this rank's experts must process, grouped by local expert, with their counts
//   [num_local_experts] (the GroupedExperts weights' first dim).
// - combine gets the local experts' outputs [sum(local_counts), dim], in the row order dispatch
//   returned, and returns [N, dim] in x's row order.
// - Both must be differentiable (their backward is the reverse exchange) and are called again,
//   with the same arguments, when activation checkpointing recomputes a block in backward.
// - combine always follows the dispatch of the same forward call; an implementation may keep the
//   split sizes of the last dispatch to use in combine.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::models::moe {

using runtime::Tensor;

struct TokenDispatcher {  // set by parallel/ (expert parallelism); null = all experts local
  virtual ~TokenDispatcher() = default;
  // x [N, dim] grouped by GLOBAL expert id with counts[e], e in [0, n_routed_experts):
  // returns the rows this rank's experts must process, grouped by LOCAL expert, and their
  // counts [num_local_experts].
  virtual std::pair<Tensor, std::vector<int64_t>> dispatch(const Tensor& x,
                                                           const std::vector<int64_t>& counts) = 0;
  // the local experts' outputs (same row order as dispatch returned) -> rows in x's order.
  virtual Tensor combine(const Tensor& y) = 0;
};

}  // namespace mt::models::moe
