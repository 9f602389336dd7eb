// Hyper-parameters of the MoE transformer (models/moe, DeepSeek-V3 / torchtitan deepseek_v3
// style), the named flavors, and parameter counts / training FLOPs computed from the arguments
// alone (nothing is allocated, so the 671B flavor can be described on a laptop).
//
// Attention is Llama's grouped-query attention (models/llama), NOT DeepSeek's multi-head latent
// attention (MLA): the flavors reproduce the published expert/FFN/embedding shapes, layer counts,
// widths and head counts, while the attention projections are GQA's wq, wk, wv, wo (n_kv_heads =
// n_heads: MLA shares no key/value heads). RoPE is plain (no YaRN extension), theta 10000.
// DeepSeek-V3's node-limited (grouped) routing and multi-token prediction are not modelled.
//
// Flavors (vocab: published, except moe_debug, whose vocabulary the builder replaces with the
// tokenizer's size):
//   moe_debug  dim 64,   4 layers (1 dense),  4 heads (2 kv), dense FFN 256, 8 experts x 64,
//              top 2, 1 shared, softmax, bias load balancing 1e-3               (tests)
//   16B        DeepSeek-V2-Lite / deepseek-moe-16b shapes: dim 2048, 27 layers (1 dense),
//              16 heads, dense FFN 10944, 64 routed experts x 1408, top 6, 2 shared, softmax,
//              vocab 102400  (published 15.7B total / 2.4B active with MLA)
//   671B       DeepSeek-V3: dim 7168, 61 layers (3 dense), 128 heads, dense FFN 18432,
//              256 routed experts x 2048, top 8, 1 shared, sigmoid with normalised top-k
//              weights x 2.5, vocab 129280  (published 671B total / 37B active with MLA)
// With GQA instead of MLA the attention holds 4 dim^2 parameters per layer instead of MLA's
// low-rank projections: +3M per layer for 16B (16.8M vs 13.8M), +18M per layer for 671B (205M vs
// 187M): totals come out within 1% of the published ones (15.79B, 672.1B) and active counts
// within 6% (2.53B, 37.7B; tests/models/moe_test.cpp checks these bounds).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::models::moe {

struct ModelArgs {
  int64_t dim = 2048;
  int64_t n_layers = 27;
  int64_t n_dense_layers = 1;  // the first n_dense_layers blocks use a dense FeedForward
  int64_t n_heads = 16;
  int64_t n_kv_heads = 0;  // 0: same as n_heads
  int64_t vocab_size = 102400;
  int64_t inter_dim = 10944;     // hidden size of the dense FeedForward
  int64_t moe_inter_dim = 1408;  // hidden size of one routed expert (and per shared expert)
  int64_t n_routed_experts = 64;
  int64_t n_shared_experts = 2;        // one FeedForward of hidden moe_inter_dim * n_shared_experts
  int64_t top_k = 6;                   // experts per token
  std::string score_func = "softmax";  // "softmax" | "sigmoid" (router scores, in f32)
  bool route_norm = false;             // divide the top-k weights by their sum
  double route_scale = 1.0;            // multiplies the (normalised) top-k weights
  // Auxiliary-loss-free balancing: after each optimizer step, expert_bias +=
  // load_balance_coeff * sign(mean load - load) (centred). 0 turns it off.
  double load_balance_coeff = 1e-3;
  // DeepSeek-V3's sequence-wise balance loss, alpha * sum_i f_i P_i, added to the loss. 0 = off.
  double aux_loss_alpha = 0.0;
  double rope_theta = 10000.0;
  int64_t max_seq_len = 4096;  // RoPE tables cover positions [0, max_seq_len)
  double norm_eps = 1e-5;

  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t head_dim() const { return dim / n_heads; }
  int64_t n_moe_layers() const { return n_layers - n_dense_layers; }
  bool is_moe_layer(int64_t layer_id) const { return layer_id >= n_dense_layers; }
  // Throws mt::Error naming the first invalid field.
  void validate() const;
};

// The flavors, in the order listed above.
std::vector<std::string> flavor_names();
// Throws mt::Error listing the valid names when `flavor` is unknown.
ModelArgs flavor_args(const std::string& flavor);

struct ParamCounts {
  int64_t total = 0;             // every unique parameter (all experts)
  int64_t active = 0;            // used per token: all but the embedding table and the idle experts
  int64_t embedding = 0;         // tok_embeddings.weight
  int64_t output = 0;            // output.weight
  int64_t dense_layer = 0;       // one block with a dense FeedForward
  int64_t moe_layer = 0;         // one block with a MoE (all experts)
  int64_t moe_layer_active = 0;  // one MoE block as a token sees it (top_k + shared experts)
};
ParamCounts count_parameters(const ModelArgs& args);

// Training FLOPs per token (forward + backward), torchtitan's convention for MoE models:
//   6 * active + 12 * n_layers * n_heads * head_dim * seq_len
// where `active` counts the top_k routed and the shared experts of each MoE layer, the router,
// attention, norms and the output projection, but not the embedding table (a lookup).
double flops_per_token(const ModelArgs& args, int64_t seq_len);

}  // namespace mt::models::moe
