// The routed experts of a MoE layer as stacked weights, run with grouped matmuls (torchtitan's
// GroupedExperts): expert e computes w2[e] (silu(w1[e] x) * w3[e] x), a SwiGLU FeedForward.
//
// Parameters (FQNs <prefix>.w1, .w2, .w3; the weights' first dim is the expert):
//   w1 [E, hidden, dim], w2 [E, dim, hidden], w3 [E, hidden, dim]
// Init (torchtitan deepseek_v3): w1 trunc_normal(0, 0.02, [-2, 2]); w2, w3 trunc_normal(0,
// out_init_std, [-2, 2]), each keyed by (seed, FQN) over the whole [num_experts, ...] tensor, so
// a weight holding only experts [expert_begin, expert_begin + E_local) (expert parallelism)
// receives exactly the values the full draw holds there.
//
// Forward: x [N, dim], rows grouped by expert (counts[e] rows for expert e, in order) -> [N, dim].
// Expert parallelism plugs in through `dispatcher` (models/moe/token_dispatcher.h): when set,
// forward runs dispatch -> the grouped matmuls over this module's (local) experts -> combine, and
// the weights then hold only the local experts' rows [E_local, ...]; when null, every expert is
// local and counts must have one entry per weight row.
//
// Float8 ([quantize.grouped_mm.float8]): convert_experts_to_float8 marks GroupedExperts to run
// their grouped GEMMs with runtime::float8_grouped_mm (torchao's rowwise recipe), w1 and w3 in
// one call that casts x once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/moe/token_dispatcher.h"
#include "runtime/nn/float8_conversion.h"
#include "runtime/nn/module.h"
#include "runtime/ops/float8_recipe.h"

namespace mt::models::moe {

using runtime::TensorOptions;
namespace nn = runtime::nn;

class GroupedExperts : public nn::Module {
 public:
  GroupedExperts(int64_t dim, int64_t hidden_dim, int64_t num_experts, double out_init_std,
                 TensorOptions options);

  // x [N, dim] grouped by global expert id, counts [num_experts()] -> [N, dim] in x's order.
  Tensor operator()(const Tensor& x, const std::vector<int64_t>& counts);
  // The expert computation alone on this module's weights: x grouped by the weights' experts
  // (counts [w1.size(0)]) -> [N, dim]. What operator() runs between dispatch and combine.
  Tensor run_local(const Tensor& x, const std::vector<int64_t>& counts);

  void reset_parameters(const nn::InitContext& ctx) override;

  int64_t num_experts() const { return num_experts_; }  // global count (routing's range)
  int64_t dim() const { return dim_; }
  int64_t hidden_dim() const { return hidden_dim_; }

  Tensor w1, w2, w3;
  // Set by expert parallelism (parallel/); null: all experts local.
  std::shared_ptr<TokenDispatcher> dispatcher;
  // The global index of the first expert the weights hold (0 unless sliced for EP); used by
  // reset_parameters to draw the right block of the full tensor.
  int64_t expert_begin = 0;
  // The three grouped GEMMs run in FP8 (set by convert_experts_to_float8).
  bool float8 = false;
  // Set by tensor parallelism (parallel/), whose ranks hold these weights whole and each route
  // a share of the tokens: the float8 weight gradients' token amaxes are reduced through it
  // (runtime::float8_grouped_mm). Null: this rank sees all its experts' tokens.
  runtime::Float8AmaxReduce float8_token_amax_reduce;

 private:
  int64_t dim_, hidden_dim_, num_experts_;
  double out_init_std_;
};

// Marks the GroupedExperts of `root` whose FQN contains one of `fqns` (non-empty strings) to run
// in FP8 on `device`, except those whose dim or hidden dim FP8 GEMMs cannot take
// (runtime::float8_grouped_mm_unsupported), listed with the reason. A device without FP8 GEMMs
// is an error naming it. Idempotent.
runtime::nn::Float8Conversion convert_experts_to_float8(nn::Module& root, runtime::Device device,
                                                        const std::vector<std::string>& fqns);

}  // namespace mt::models::moe
