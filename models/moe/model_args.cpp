#include "models/moe/model_args.h"

#include <cmath>

#include "models/flavor_table.h"
#include "runtime/core/error.h"

namespace mt::models::moe {

void ModelArgs::validate() const {
  MT_CHECK(dim > 0 && n_layers > 0 && n_heads > 0 && vocab_size > 0,
           "moe ModelArgs: expected positive dim, n_layers, n_heads and vocab_size, got dim ", dim,
           ", n_layers ", n_layers, ", n_heads ", n_heads, ", vocab_size ", vocab_size);
  MT_CHECK(n_dense_layers >= 0 && n_dense_layers <= n_layers, "moe ModelArgs: n_dense_layers ",
           n_dense_layers, " outside [0, n_layers = ", n_layers, "]");
  MT_CHECK(dim % n_heads == 0, "moe ModelArgs: dim ", dim, " is not divisible by n_heads ",
           n_heads);
  MT_CHECK(head_dim() % 2 == 0, "moe ModelArgs: RoPE needs an even head_dim, got dim ", dim,
           " / n_heads ", n_heads, " = ", head_dim());
  MT_CHECK(n_kv_heads >= 0 && n_heads % kv_heads() == 0, "moe ModelArgs: n_heads ", n_heads,
           " is not a multiple of n_kv_heads ", n_kv_heads);
  MT_CHECK(n_dense_layers == 0 || inter_dim > 0, "moe ModelArgs: inter_dim must be > 0 for the ",
           n_dense_layers, " dense layers, got ", inter_dim);
  if (n_moe_layers() > 0) {
    MT_CHECK(moe_inter_dim > 0, "moe ModelArgs: expected moe_inter_dim > 0, got ", moe_inter_dim);
    MT_CHECK(n_routed_experts > 0, "moe ModelArgs: expected n_routed_experts > 0, got ",
             n_routed_experts);
    MT_CHECK(top_k >= 1 && top_k <= n_routed_experts, "moe ModelArgs: top_k ", top_k,
             " outside [1, n_routed_experts = ", n_routed_experts, "]");
    MT_CHECK(n_shared_experts >= 0, "moe ModelArgs: expected n_shared_experts >= 0, got ",
             n_shared_experts);
  }
  MT_CHECK(score_func == "softmax" || score_func == "sigmoid", "moe ModelArgs: score_func '",
           score_func, "' is not one of softmax, sigmoid");
  MT_CHECK(std::isfinite(route_scale) && route_scale > 0,
           "moe ModelArgs: expected route_scale > 0, got ", route_scale);
  MT_CHECK(std::isfinite(load_balance_coeff) && load_balance_coeff >= 0,
           "moe ModelArgs: expected load_balance_coeff >= 0 (0 = off), got ", load_balance_coeff);
  MT_CHECK(std::isfinite(aux_loss_alpha) && aux_loss_alpha >= 0,
           "moe ModelArgs: expected aux_loss_alpha >= 0 (0 = off), got ", aux_loss_alpha);
  MT_CHECK(std::isfinite(rope_theta) && rope_theta > 0,
           "moe ModelArgs: expected rope_theta > 0, got ", rope_theta);
  MT_CHECK(max_seq_len > 0, "moe ModelArgs: expected max_seq_len > 0, got ", max_seq_len);
  MT_CHECK(norm_eps > 0, "moe ModelArgs: expected norm_eps > 0, got ", norm_eps);
}

namespace {

using Flavor = models::Flavor<ModelArgs>;

const std::vector<Flavor>& flavors() {
  static const std::vector<Flavor> table = [] {
    ModelArgs debug;
    debug.dim = 64;
    debug.n_layers = 4;
    debug.n_dense_layers = 1;
    debug.n_heads = 4;
    debug.n_kv_heads = 2;
    debug.vocab_size = 2000;
    debug.inter_dim = 256;
    debug.moe_inter_dim = 64;
    debug.n_routed_experts = 8;
    debug.n_shared_experts = 1;
    debug.top_k = 2;
    debug.score_func = "softmax";
    debug.max_seq_len = 2048;

    ModelArgs b16;  // DeepSeek-V2-Lite (the defaults above)
    b16.dim = 2048;
    b16.n_layers = 27;
    b16.n_dense_layers = 1;
    b16.n_heads = 16;
    b16.vocab_size = 102400;
    b16.inter_dim = 10944;
    b16.moe_inter_dim = 1408;
    b16.n_routed_experts = 64;
    b16.n_shared_experts = 2;
    b16.top_k = 6;
    b16.score_func = "softmax";

    ModelArgs b671;  // DeepSeek-V3
    b671.dim = 7168;
    b671.n_layers = 61;
    b671.n_dense_layers = 3;
    b671.n_heads = 128;
    b671.vocab_size = 129280;
    b671.inter_dim = 18432;
    b671.moe_inter_dim = 2048;
    b671.n_routed_experts = 256;
    b671.n_shared_experts = 1;
    b671.top_k = 8;
    b671.score_func = "sigmoid";
    b671.route_norm = true;
    b671.route_scale = 2.5;
    return std::vector<Flavor>{{"moe_debug", debug}, {"16B", b16}, {"671B", b671}};
  }();
  return table;
}

}  // namespace

std::vector<std::string> flavor_names() { return flavor_names_of(flavors()); }

ModelArgs flavor_args(const std::string& flavor) {
  return find_flavor(flavors(), flavor, "deepseek_v3");
}

ParamCounts count_parameters(const ModelArgs& a) {
  a.validate();
  ParamCounts c;
  const int64_t q_dim = a.n_heads * a.head_dim(), kv_dim = a.kv_heads() * a.head_dim();
  const int64_t attention = 2 * a.dim * q_dim + 2 * a.dim * kv_dim;  // wq, wo; wk, wv
  const int64_t norms = 2 * a.dim;                                   // attention_norm, ffn_norm
  const int64_t expert = 3 * a.dim * a.moe_inter_dim;                // w1, w2, w3 of one expert
  const int64_t router = a.dim * a.n_routed_experts;
  const int64_t shared = a.n_shared_experts * expert;
  c.dense_layer = attention + norms + 3 * a.dim * a.inter_dim;
  c.moe_layer = attention + norms + router + a.n_routed_experts * expert + shared;
  c.moe_layer_active = attention + norms + router + a.top_k * expert + shared;
  c.embedding = a.vocab_size * a.dim;
  c.output = a.vocab_size * a.dim;
  const int64_t dense = a.n_dense_layers, moe = a.n_moe_layers();
  c.total = c.embedding + dense * c.dense_layer + moe * c.moe_layer + a.dim + c.output;
  c.active = dense * c.dense_layer + moe * c.moe_layer_active + a.dim + c.output;
  return c;
}

double flops_per_token(const ModelArgs& a, int64_t seq_len) {
  MT_CHECK(seq_len > 0, "deepseek_v3 flops_per_token: expected seq_len > 0, got ", seq_len);
  const ParamCounts c = count_parameters(a);
  return 6.0 * double(c.active) +
         12.0 * double(a.n_layers) * double(a.n_heads) * double(a.head_dim()) * double(seq_len);
}

}  // namespace mt::models::moe
