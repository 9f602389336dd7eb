// Expert parallelism's token exchange: routed experts are split over the `ep` mesh dimension, and
// each MoE layer sends every token row to the rank that owns its expert, then brings the experts'
// outputs back (torchtitan's ExpertParallel / DeepSeek's dispatch and combine).
//
//   ExpertTokenExchange exchange(mesh->group_ptr("ep"), num_experts);
//   auto [local_x, local_counts] = exchange.dispatch(x, counts);  // x grouped by global expert
//   Tensor y_local = grouped_mm(...local_x, local_counts...);      // this rank's experts only
//   Tensor y = exchange.combine(y_local);                          // back in x's row order
//
// - Rank r of the ep group owns experts [r L, (r + 1) L), L = num_experts / ep size.
// - dispatch: the per-expert counts are exchanged first (one small all-to-all, then the split
//   sizes are read on the host: the one host synchronisation, as torch's all_to_all_single with
//   output splits needs), then the rows (an all-to-all with per-step, uneven splits). The rows
//   arrive grouped by source rank, then local expert, and are regrouped by local expert so the
//   grouped matmul sees one block per expert.
// - combine undoes the last dispatch: regroup by source rank, reverse all-to-all.
// - Both are differentiable: the backward of an all-to-all is the all-to-all with the splits
//   swapped, the backward of a regrouping is its inverse (index_select's backward).
// - Every ep rank must call dispatch and combine the same number of times in the same order (they
//   are collectives), also with zero tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/process_group.h"
#include "runtime/core/tensor.h"

namespace mt::parallel {

// all_to_all_single along dim 0 that autograd sees: this rank sends in_splits[j] rows of x to
// rank j and receives out_splits[j] rows from it. Backward: the reverse exchange of the gradient.
Tensor all_to_all_rows(std::shared_ptr<ProcessGroup> group, const Tensor& x,
                       std::vector<int64_t> out_splits,
                       std::vector<int64_t> in_splits, const std::string& name);

class ExpertTokenExchange {
 public:
  // `group`: the ep group (its size must divide num_experts).
  ExpertTokenExchange(std::shared_ptr<ProcessGroup> group, int64_t num_experts);

  int64_t num_experts() const { return num_experts_; }
  int64_t num_local_experts() const { return num_local_; }
  int64_t first_local_expert() const { return int64_t(group_->rank()) * num_local_; }

  // x [N, ...] whose rows are grouped by global expert, counts[e] rows for expert e (sum N) ->
  // the rows this rank's experts process, grouped by local expert, and their counts [L].
  std::pair<Tensor, std::vector<int64_t>> dispatch(const Tensor& x,
                                                   const std::vector<int64_t>& counts);
  // The local experts' outputs (rows as dispatch returned them) -> rows in the order of the x
  // given to the last dispatch.
  Tensor combine(const Tensor& y);

 private:
  std::shared_ptr<ProcessGroup> group_;
  int64_t num_experts_, num_local_;
  // The last dispatch, for its combine.
  std::vector<int64_t> send_splits_, recv_splits_;
  Tensor to_expert_order_;  // received row i (by source rank) -> its place grouped by expert
  Tensor to_rank_order_;    // the inverse permutation
  bool dispatched_ = false;
};

}  // namespace mt::parallel
