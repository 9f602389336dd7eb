// Llama 3 hyper-parameters (ModelArgs), the named flavors, and the parameter count and training
// FLOPs per token computed from the arguments alone: nothing is allocated, so the 405B flavor can
// be described on a laptop.
//
// Flavors (torchtitan's llama3 flavors plus the published Llama 3.2 shapes), vocab 128256 except
// debugmodel (2000; the builder replaces it with the tokenizer's size):
//   debugmodel  dim 256,   6 layers,  16 heads, 16 kv heads, multiple_of 256
//   1B          dim 2048, 16 layers,  32 heads,  8 kv, ffn x1.5, multiple_of 256,  tied, rope x32
//   3B          dim 3072, 28 layers,  24 heads,  8 kv, ffn x1.0, multiple_of 256,  tied, rope x32
//   8B          dim 4096, 32 layers,  32 heads,  8 kv, ffn x1.3, multiple_of 1024, rope x8
//   70B         dim 8192, 80 layers,  64 heads,  8 kv, ffn x1.3, multiple_of 4096, rope x8
//   405B        dim 16384, 126 layers, 128 heads, 8 kv, ffn x1.2, multiple_of 4096, rope x8
// All use rope_theta 500000 and Llama 3.1 RoPE frequency scaling (debugmodel too, as torchtitan)
// and max_position_embeddings 131072.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/ops/rope.h"

namespace mt::models::llama {

// A pipeline stage's share of the model (parallel/pipeline): the blocks [begin, end), with the
// embeddings when begin == 0 and the final norm and output when end == n_layers. The stage's
// modules keep the whole model's FQNs (layers.<global index>) and initial values; the others are
// never built. end = -1: n_layers. The default is the whole model.
struct LayerRange {
  int64_t begin = 0;
  int64_t end = -1;
};

struct ModelArgs {
  int64_t dim = 4096;
  int64_t n_layers = 32;
  int64_t n_heads = 32;
  int64_t n_kv_heads = 0;  // 0: same as n_heads (multi-head attention)
  int64_t vocab_size = 128256;
  int64_t multiple_of = 256;                 // the FFN hidden size is rounded up to a multiple
  std::optional<double> ffn_dim_multiplier;  // scales the FFN hidden size (before rounding)
  double norm_eps = 1e-5;
  double rope_theta = 500000.0;
  std::optional<runtime::RopeScaling> rope_scaling = runtime::RopeScaling{};  // nullopt: none
  int64_t max_seq_len = 2048;   // RoPE tables cover positions [0, max_seq_len) (a run's seq_len)
  // The context the architecture is made for (config.json's max_position_embeddings; Llama 3.1
  // and 3.2: 131072). Not a computed value: a run's max_seq_len may be shorter.
  int64_t max_position_embeddings = 131072;
  bool depth_init = true;       // wo/w2/w3 std 0.02/sqrt(2(layer+1)); else 0.02/sqrt(2 n_layers)
  bool tie_embeddings = false;  // output.weight is tok_embeddings.weight

  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t head_dim() const { return dim / n_heads; }
  // Meta/torchtitan: h = int(2 * 4 * dim / 3); h = int(ffn_dim_multiplier * h) when set; then
  // rounded up to a multiple of multiple_of.
  int64_t ffn_hidden_dim() const;
  // Throws mt::Error naming the first invalid field (sizes, divisibility, eps, theta).
  void validate() const;
};

// Every field in which two Llamas differ as models (the sizes, vocab, norm eps, RoPE theta and
// scaling, tied embeddings; not max_seq_len, max_position_embeddings or the init), one line
// each: "<field>: <a> in <a_name>, <b> in <b_name>". Empty: the same architecture.
std::vector<std::string> architecture_differences(const ModelArgs& a, const std::string& a_name,
                                                  const ModelArgs& b, const std::string& b_name);

// The flavors, in the order listed above.
std::vector<std::string> flavor_names();
// Throws mt::Error listing the valid names when `flavor` is unknown.
ModelArgs flavor_args(const std::string& flavor);

struct ParamCounts {
  int64_t total = 0;      // unique parameters (a tied table counted once)
  int64_t embedding = 0;  // tok_embeddings.weight
  int64_t output = 0;     // output.weight (0 when tied)
  int64_t per_layer = 0;  // one TransformerBlock
};
ParamCounts count_parameters(const ModelArgs& args);

// Training FLOPs per token (forward + backward), torchtitan's get_nparams_and_flops convention:
//   6 * N + 12 * n_layers * n_heads * head_dim * seq_len
// where N is every parameter except the embedding table, plus the output projection's
// vocab * dim even when it is tied to the embedding (its matmul is compute; the lookup is not).
double flops_per_token(const ModelArgs& args, int64_t seq_len);

}  // namespace mt::models::llama
