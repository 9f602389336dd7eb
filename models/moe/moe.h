// The MoE feed-forward layer (DeepSeek-V3 / torchtitan MoE): a top-k router, routed experts run
// as grouped matmuls over the tokens sorted by expert, and optional shared experts. Dropless:
// every token reaches each of its top_k experts (no capacity factor).
//
//   x [B, T, dim] -> N = B*T tokens
//   router -> weights [N, k], indices [N, k]          (models/moe/router.h)
//   sort the N*k (token, expert) pairs by expert, stable (ties in token order): deterministic
//   y = experts(x[token of each pair], counts)         (models/moe/experts.h; EP plugs in there)
//   out[t] = sum over t's pairs of weight * y  (f32 products, index_add in pair order)
//          + shared_experts(x[t])                      (a llama FeedForward, hidden
//                                                       moe_inter_dim * n_shared_experts)
// The sort and the counts are computed on the host (the counts shape the grouped matmuls).
//
// Parameters and buffers (prefix layers.<i>.moe.):
//   expert_bias        [E] f32, persistent buffer (saved in checkpoints, not a parameter): the
//                      routing bias of auxiliary-loss-free load balancing, updated by
//                      update_expert_bias (models/moe/load_balancing.h), not by the optimizer
//   tokens_per_expert  [E] i64, non-persistent buffer: (token, expert) pairs routed to each
//                      expert since the last reset, summed over the micro-batches of a step.
//                      Counted once per training forward: forwards under no_grad outside
//                      activation checkpointing (evaluation) and checkpoint recomputes in
//                      backward do not count.
//   router.gate.weight, experts.{w1,w2,w3}, shared_experts.{w1,w2,w3}.weight
//
// Auxiliary loss (aux_loss_alpha > 0): DeepSeek-V3's sequence-wise balance loss, per sequence b
//   f_i = E / (k T) * #{t : expert i among token t's chosen experts}    (no gradient)
//   P_i = mean_t s'_{t,i},  s' = scores / sum_j scores_j  (a no-op for softmax scores)
//   L = alpha * mean_b sum_i f_i P_i
// returned as forward()'s second output (0-dim, f32; f64 for f64 parameters) so that the
// model's loss adds it; the chosen experts are the ones actually routed to (bias included).
// On a share of each sequence (context parallelism: set_sequence_shards), f counts the whole
// sequence's tokens (summed over the shards, T the whole length) and P_i is the mean over this
// shard's tokens, so the shards' losses, each weighted by its tokens as the model's loss weights
// it, add up to the whole sequences' (exactly when every token's target counts, as in language-
// model training; with ignored targets each shard weights its share by its own valid tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "models/llama/model.h"
#include "models/moe/experts.h"
#include "models/moe/model_args.h"
#include "models/moe/router.h"
#include "runtime/nn/module.h"

namespace mt::models::moe {

class MoE : public nn::Module {
 public:
  // out_init_std: the std of the router gate, experts' w2/w3 and shared experts' w2/w3
  // (deepseek_v3: 0.02 / sqrt(2 (layer_id + 1))).
  MoE(const ModelArgs& args, double out_init_std, TensorOptions options);

  // x [B, T, dim] -> [B, T, dim] (the auxiliary loss, if any, is dropped).
  Tensor operator()(const Tensor& x);
  // {out [B, T, dim]} or, when aux_loss_alpha > 0, {out, aux_loss (0-dim)}.
  std::vector<Tensor> forward(const Tensor& x);

  bool has_aux_loss() const { return aux_loss_alpha_ > 0; }
  // The forwards run on one of `shards` shares of each sequence; `sum` adds a tensor over the
  // shards in place (collective). shards 1 (and no sum): whole sequences. Two sources, which
  // multiply: the step's (context parallelism, set per step) and the layer input's own
  // (tensor parallelism splits it, set once).
  void set_sequence_shards(int64_t shards, std::function<void(Tensor&)> sum);
  void set_input_shards(int64_t shards, std::function<void(Tensor&)> sum);
  int64_t num_experts() const { return num_experts_; }
  int64_t top_k() const { return top_k_; }
  // tokens_per_expert on the host; reset_tokens_per_expert() zeroes it.
  std::vector<int64_t> tokens_per_expert_counts() const;
  void reset_tokens_per_expert();

  std::shared_ptr<GroupedExperts> experts;
  std::shared_ptr<Router> router;
  std::shared_ptr<llama::FeedForward> shared_experts;  // null when n_shared_experts == 0
  Tensor expert_bias;
  Tensor tokens_per_expert;
  // The last forward's chosen experts [N, top_k] (i64, detached), for tests and inspection.
  Tensor last_indices;

 private:
  int64_t num_experts_, top_k_;
  double aux_loss_alpha_;
  struct Shards {
    int64_t count = 1;
    std::function<void(Tensor&)> sum;  // over them, in place (collective)
  };
  Shards sequence_shards_, input_shards_;
};

}  // namespace mt::models::moe
