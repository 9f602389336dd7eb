// The MoE transformer (DeepSeek-V3 / torchtitan deepseek_v3 layout, with Llama's attention):
//   tokens [B, T] -> tok_embeddings -> n_layers x TransformerBlock -> norm -> output -> logits
//   TransformerBlock i: h = x + attention(attention_norm(x))
//                       out = h + feed_forward(ffn_norm(h))   for i < n_dense_layers
//                       out = h + moe(ffn_norm(h))            otherwise (models/moe/moe.h)
// Attention, FeedForward, the init-aware Linear/Embedding are models/llama's (grouped-query
// attention, not DeepSeek's MLA; see models/moe/model_args.h). RoPE: plain, interleaved pairs as
// llama, theta = rope_theta, tables as non-persistent buffers (rope_cos, rope_sin).
//
// Parameter FQNs (torchtitan's): tok_embeddings.weight, layers.<i>.attention.{wq,wk,wv,wo}.weight,
// layers.<i>.{attention_norm,ffn_norm}.weight, layers.<i>.feed_forward.{w1,w2,w3}.weight (dense
// blocks), layers.<i>.moe.router.gate.weight, layers.<i>.moe.experts.{w1,w2,w3},
// layers.<i>.moe.shared_experts.{w1,w2,w3}.weight (MoE blocks), norm.weight, output.weight.
// Buffers: layers.<i>.moe.expert_bias (persistent), layers.<i>.moe.tokens_per_expert (not).
//
// Initialisation (torchtitan deepseek_v3), each parameter keyed by (seed, FQN):
//   tok_embeddings   normal(0, 1)
//   wq, wk, wv, w1 (dense, shared and routed experts)      trunc_normal(0, 0.02, [-2, 2])
//   wo, w2, w3 (all kinds), router gate                     trunc_normal(0, s, [-2, 2]),
//                                                           s = 0.02 / sqrt(2 (layer_id + 1))
//   output           trunc_normal(0, dim^-0.5, [-3 dim^-0.5, 3 dim^-0.5])
//   norms ones, expert_bias zeros
//
// Logits come back in the parameters' dtype, except 16-bit parameters, whose logits are f32.
// Decoding (forward_cached) uses llama's KVCache, as the attention is llama's.
// Activation checkpointing ("full") checkpoints every block; MoE token counts are still taken once
// per forward (see moe.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "models/llama/kv_cache.h"
#include "models/llama/model.h"
#include "models/moe/model_args.h"
#include "models/moe/moe.h"
#include "runtime/nn/embedding.h"
#include "runtime/nn/module.h"
#include "runtime/nn/rms_norm.h"

namespace mt::models::moe {

class TransformerBlock : public nn::Module {
 public:
  TransformerBlock(int64_t layer_id, const ModelArgs& args, TensorOptions options);
  // x [B, T, dim] -> {out} or, for a MoE block with an auxiliary loss, {out, aux_loss (0-dim)}.
  // With a cache (decoding): attention at the cache's position, appending this layer's keys.
  std::vector<Tensor> forward(const Tensor& x, const Tensor& cos, const Tensor& sin,
                              llama::KVCache* cache = nullptr);
  Tensor operator()(const Tensor& x, const Tensor& cos, const Tensor& sin) {
    return forward(x, cos, sin)[0];
  }

  std::shared_ptr<llama::Attention> attention;
  std::shared_ptr<llama::FeedForward> feed_forward;  // dense blocks; null in MoE blocks
  std::shared_ptr<MoE> moe;                          // MoE blocks; null in dense blocks
  std::shared_ptr<nn::RMSNorm> attention_norm, ffn_norm;
  int64_t layer_id;
};

class Transformer : public nn::Module {
 public:
  // Builds and initialises with init_weights(seed). options.dtype: the parameters' dtype.
  // `range`: a pipeline stage's blocks alone (llama::LayerRange; the embeddings on the first
  // stage, the final norm and output on the last), with the whole model's FQNs and values.
  explicit Transformer(const ModelArgs& args, uint64_t seed = 0, TensorOptions options = {},
                       llama::LayerRange range = {});

  struct Output {
    Tensor logits;    // [B, T, V]
    Tensor aux_loss;  // 0-dim sum of the MoE blocks' auxiliary losses; undefined when off
  };
  // tokens [B, T] (i64 or i32, values in [0, vocab_size), T <= max_seq_len). Logits of 16-bit
  // parameters are cast to f32 unless f32_logits is false (the training loss, which reads them
  // in f32 anyway: see llama's model.h).
  Output forward_with_aux(const Tensor& tokens, bool f32_logits = true);
  // The logits alone.
  Tensor operator()(const Tensor& tokens) { return forward_with_aux(tokens).logits; }
  // A pipeline stage's forward (see llama's Transformer::stage_forward): tokens or the previous
  // stage's hidden states -> hidden states, or logits in the compute dtype on the last stage;
  // with the auxiliary loss of the stage's MoE layers (undefined when off).
  Output stage_forward(const Tensor& input);
  // Incremental decoding, as llama's Transformer::forward_cached (the whole model or a pipeline
  // stage): tokens or hidden states at positions [cache.length(), + T) -> hidden states or f32
  // logits, appending each block's keys and values; no autograd, no auxiliary loss.
  Tensor forward_cached(const Tensor& input, llama::KVCache& cache);
  // An empty cache of this model's (or stage's) layers on the parameters' device, as llama's.
  llama::KVCache make_kv_cache(int64_t batch, int64_t max_seq = 0,
                               std::optional<runtime::DType> dtype = std::nullopt,
                               int64_t kv_head_shards = 1) const;
  const llama::LayerRange& layer_range() const { return range_; }
  bool is_whole() const { return range_.begin == 0 && range_.end == args_.n_layers; }

  // The TransformerBlocks `ac` names run under activation checkpointing; the others do not.
  void set_activation_checkpointing(llama::ActivationCheckpointing ac);
  // Context parallelism, as llama's Transformer::set_sequence_shard; the MoE layers' auxiliary
  // loss counts each sequence's routing over every shard (MoE::set_sequence_shards).
  void set_sequence_shard(const std::optional<SequenceShard>& shard);

  // The MoE layers, in block order.
  std::vector<std::shared_ptr<MoE>> moe_layers() const;

  const ModelArgs& args() const { return args_; }

  // Null where a pipeline stage does not hold them.
  std::shared_ptr<llama::InitEmbedding> tok_embeddings;
  std::shared_ptr<nn::ModuleList> layers;  // children named by global index
  std::vector<std::shared_ptr<TransformerBlock>> blocks;  // the same modules as `layers`, typed
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<llama::InitLinear> output;
  Tensor rope_cos, rope_sin;  // non-persistent buffers

 private:
  // The forward of the blocks held (tokens or hidden states in; logits or hidden states out),
  // with `cache` when decoding.
  Output forward_part(const Tensor& input, bool f32_logits, llama::KVCache* cache = nullptr);

  ModelArgs args_;
  llama::LayerRange range_;
  Tensor positions_;  // set_sequence_shard's; undefined: the tokens are at 0, 1, ...
};

}  // namespace mt::models::moe
