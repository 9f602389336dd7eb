// Auxiliary-loss-free load balancing of the MoE layers (DeepSeek-V3, arXiv 2408.15664; as
// torchtitan's optimizer-step hook): after each optimizer step, each MoE layer's routing bias is
// nudged toward balance by the sign of its load error, and the token counts are reset.
//
//   counts = all_reduce_sum(tokens_per_expert of every MoE layer)   one [n_moe_layers, E] f64
//   delta_e = coeff * sign(mean(counts) - counts_e);  delta -= mean(delta)
//   expert_bias += delta                              (coeff = ModelArgs::load_balance_coeff)
// Under-loaded experts gain bias, over-loaded ones lose it. Centring delta (torchtitan) keeps the
// bias from drifting and changes no top-k choice. coeff = 0 only measures and resets.
//
// all_reduce_sum sums a tensor in place over the data-parallel ranks (identity on one process;
// the trainer passes its data-parallel all-reduce). Every rank then applies the same update, so
// the biases stay identical across ranks.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "models/moe/model.h"

namespace mt::models::moe {

// Returns metrics for the log (empty when no layer routed a token since the last reset):
//   "moe_load_imbalance"            max / mean tokens per expert, averaged over the MoE layers
//   "moe_load_imbalance_layer<i>"   the same for block i (its index in the whole model, also
//                                   on a pipeline stage)
// (1 = perfectly balanced; E / top_k at worst, every token on the same top_k experts).
std::map<std::string, double> update_expert_bias(
    Transformer& model, const std::function<void(Tensor&)>& all_reduce_sum);

}  // namespace mt::models::moe
