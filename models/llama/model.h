// The Llama 3 transformer (Meta's reference / torchtitan's llama3 model), built from runtime ops:
//   tokens [B, T] -> tok_embeddings -> n_layers x TransformerBlock -> norm -> output -> logits
//   TransformerBlock: h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h))
//   Attention: wq, wk, wv, wo (no bias), grouped-query (n_heads queries share n_kv_heads keys and
//              values), RoPE on q and k, causal scaled_dot_product_attention.
//   FeedForward: w2(silu(w1(x)) * w3(x)) (SwiGLU), hidden size ModelArgs::ffn_hidden_dim().
//
// Parameter FQNs are torchtitan's: tok_embeddings.weight,
// layers.<i>.attention.{wq,wk,wv,wo}.weight, layers.<i>.feed_forward.{w1,w2,w3}.weight,
// layers.<i>.{attention_norm,ffn_norm}.weight, norm.weight, output.weight (absent from
// named_parameters()/state_dict() when tied: the one table is listed as tok_embeddings.weight). The
// RoPE tables are non-persistent buffers (rope_cos, rope_sin), left out of checkpoints.
//
// RoPE layout: runtime/ops/rope.h rotates interleaved pairs (x[2i], x[2i+1]) of each head, as
// Meta's checkpoints (not Hugging Face's rotate_half). Exporting to / importing from the Hugging
// Face layout must therefore permute the rows of wq and wk within each head (HF's
// convert_llama_weights_to_hf permute: view(heads, d/2, 2, dim).transpose(1, 2)); wv, wo and the
// rest are unchanged.
//
// Initialisation (reset_parameters, so Module::init_weights(seed) draws every parameter from
// RandomKey(seed, its FQN), independent of thread count and sharding), torchtitan's init_weights:
//   tok_embeddings   normal(0, 1)                              (nn.init.normal_)
//   wq, wk, wv, w1   trunc_normal(0, 0.02, [-2, 2])
//   wo, w2, w3       trunc_normal(0, s, [-2, 2]), s = 0.02 / sqrt(2 (layer_id + 1)) with
//   depth_init,
//                    else 0.02 / sqrt(2 n_layers)
//   output           trunc_normal(0, dim^-0.5, [-3 dim^-0.5, 3 dim^-0.5])
//   norms            ones
// A tied table gets the output's init (a unit-variance table would give logits of std sqrt(dim)),
// drawn with the key of its FQN tok_embeddings.weight.
//
// Logits come back in the parameters' dtype, except 16-bit parameters, whose logits are cast to
// f32 (torchtitan's `output(h).float()`). The training loss skips that cast (loss_logits): the
// cross-entropy kernels read 16-bit logits in f32, the same values without an [N, V] f32 copy.
//
// Incremental decoding (inference): forward_cached(tokens, cache) runs the same layers over new
// tokens at position offset p = cache.length() (RoPE at p + t), appending their keys and values to
// a KVCache (models/llama/kv_cache.h) and attending over the cached [0, p + T) with the causal mask
// aligned bottom-right; its logits equal the full-sequence forward's at those positions (to
// rounding). models/llama/generate.h samples text with it.
//
// Context parallelism: set_sequence_shard(SequenceShard) makes the forwards run on a rank's share
// of each sequence (models/sequence_shard.h): RoPE at the tokens' own positions, and each
// Attention's core_attention in place of the local causal attention (the model issues no
// collective itself; parallel/context's attention does).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/llama/kv_cache.h"
#include "models/llama/model_args.h"
#include "models/sequence_shard.h"
#include "runtime/nn/embedding.h"
#include "runtime/nn/linear.h"
#include "runtime/nn/module.h"
#include "runtime/nn/rms_norm.h"

namespace mt::models::llama {

// The RoPE tables of a decoder (f32, or the parameters' dtype when wider) on options.device,
// registered on `model` as the non-persistent buffers "rope_cos" and "rope_sin" (left out of
// checkpoints). Used by llama and the MoE decoder (models/moe).
void register_rope_buffers(runtime::nn::Module& model, runtime::Tensor& cos, runtime::Tensor& sin,
                           int64_t head_dim, int64_t max_seq_len, double theta,
                           std::optional<runtime::RopeScaling> scaling,
                           const runtime::TensorOptions& options);

using runtime::Tensor;
using runtime::TensorOptions;
namespace nn = runtime::nn;

// A bias-free Linear initialised trunc_normal(0, std, [lo, hi]).
class InitLinear : public nn::Linear {
 public:
  InitLinear(int64_t in, int64_t out, double std, double lo, double hi, TensorOptions options);
  void reset_parameters(const nn::InitContext& ctx) override;
  // When set (tied output), reset_parameters leaves the weight alone: its owner initialises it.
  bool skip_init = false;

 private:
  double std_, lo_, hi_;
};

// An Embedding initialised normal(0, 1), or trunc_normal(0, std, [-3 std, 3 std]) when tied.
class InitEmbedding : public nn::Embedding {
 public:
  InitEmbedding(int64_t vocab, int64_t dim, TensorOptions options);
  void reset_parameters(const nn::InitContext& ctx) override;
  double tied_std = 0.0;  // > 0: the table is also the output projection
};

class Attention : public nn::Module {
 public:
  Attention(const ModelArgs& args, double out_init_std, TensorOptions options);
  // x [B, T, dim]; cos/sin: the RoPE tables [max_seq_len, head_dim / 2]. With a cache, x holds
  // the tokens at positions [cache->length(), + T): their keys/values go into layer `layer` of the
  // cache and the queries attend over every cached position.
  Tensor operator()(const Tensor& x, const Tensor& cos, const Tensor& sin, KVCache* cache = nullptr,
                    int64_t layer = 0);

  std::shared_ptr<InitLinear> wq, wk, wv, wo;
  // When set (context parallelism: SequenceShard::attention), the causal attention of this
  // layer's queries, keys and values in place of scaled_dot_product_attention over x's tokens
  // alone. Decoding (with a cache) never uses it.
  std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v)> core_attention;

 private:
  // The q, k and v projections of h [B, T, dim], each [B, T, heads * head_dim].
  std::vector<Tensor> project_qkv(const Tensor& h);

  int64_t n_heads_, n_kv_heads_, head_dim_;
};

class FeedForward : public nn::Module {
 public:
  FeedForward(int64_t dim, int64_t hidden_dim, double out_init_std, TensorOptions options);
  Tensor operator()(const Tensor& x);

  std::shared_ptr<InitLinear> w1, w2, w3;
};

class TransformerBlock : public nn::Module {
 public:
  TransformerBlock(int64_t layer_id, const ModelArgs& args, TensorOptions options);
  // With a cache: incremental decoding, using layer `layer_id` of the cache (see Attention).
  Tensor operator()(const Tensor& x, const Tensor& cos, const Tensor& sin,
                    KVCache* cache = nullptr);

  std::shared_ptr<Attention> attention;
  std::shared_ptr<FeedForward> feed_forward;
  std::shared_ptr<nn::RMSNorm> attention_norm, ffn_norm;
  int64_t layer_id;
};

// Context parallelism, shared by the decoders in models/: sets (or, with nullopt, clears) each
// block's Attention::core_attention and `positions` (the RoPE positions of the module's tokens).
template <class Block>
void set_blocks_sequence_shard(const std::vector<std::shared_ptr<Block>>& blocks,
                               const std::optional<SequenceShard>& shard, Tensor& positions) {
  positions = shard ? shard->positions : Tensor();
  for (const auto& block : blocks) block->attention->core_attention = shard ? shard->attention : nullptr;
}
// The RoPE tables a forward over `input` (tokens [B, T], or a later pipeline stage's hidden
// states) reads: their rows at `positions` (a sequence shard's: one per token), or the whole
// tables when positions is undefined.
std::pair<Tensor, Tensor> rope_rows(const Tensor& cos, const Tensor& sin, const Tensor& positions,
                                    const Tensor& input, const char* model);
// Decoding needs whole sequences: throws when `positions` (a sequence shard's) is set.
void check_not_sharded(const Tensor& positions, const char* model);

// Checks a decoder's input: tokens [B, T] of i64 or i32 with 1 <= T <= max_seq_len; `model`
// names the model in the message ("llama Transformer"). Shared by the decoders in models/.
void check_token_batch(const Tensor& tokens, int64_t max_seq_len, const char* model);

// Which transformer blocks run under activation checkpointing (recomputed in backward): every
// `period`-th, counted from 1 as torchtitan's selective option counts (period 2: the blocks at
// index 1, 3, 5, ...); 0: none; 1: all ("full"). With `keep_ops` (torchtitan's op-level "op"
// option; period 1), each block keeps its attention output and every other matmul output from the
// forward and recomputes only the rest (autograd::matmul_and_attention_policy).
struct ActivationCheckpointing {
  int64_t period = 0;
  bool keep_ops = false;
  bool checkpoints(int64_t block) const { return period > 0 && (block + 1) % period == 0; }
  // Sets block `index`'s checkpointing (Module::set_activation_checkpointing) as described.
  void apply(nn::Module& block, int64_t index) const;
};
// "none", "full", "selective:N" (every N-th block, N > 0) or "selective:op" (every block, by op);
// anything else throws naming the valid forms.
ActivationCheckpointing parse_activation_checkpointing(const std::string& spec);

// Shared by the decoders in models/: `range` with end -1 resolved, checked against n_layers (a
// non-empty part; not a partial one with tied embeddings); `model` names the model in errors.
LayerRange resolve_layer_range(LayerRange range, int64_t n_layers, bool tied_embeddings,
                               const char* model);
// A stage's input: tokens (check_token_batch) when it holds the embeddings, else hidden states
// [B, T <= max_seq_len, dim] of a floating dtype.
void check_stage_input(const Tensor& input, bool tokens, int64_t dim, int64_t max_seq_len,
                       const LayerRange& range, const char* model);

// Registers make(i) for each block i of `range` in `layers`, named by its global index (as the
// whole model's ModuleList numbers them), and returns them typed.
template <class Block, class Make>
std::vector<std::shared_ptr<Block>> build_blocks(nn::ModuleList& layers, const LayerRange& range,
                                                 Make&& make) {
  std::vector<std::shared_ptr<Block>> blocks;
  for (int64_t i = range.begin; i < range.end; ++i) {
    std::shared_ptr<Block> block = make(i);
    // push_back counts from 0: a later stage names its blocks itself.
    blocks.push_back(range.begin == 0 ? layers.push_back(block)
                                      : layers.register_module(std::to_string(i), block));
  }
  return blocks;
}

class Transformer : public nn::Module {
 public:
  // Builds and initialises with init_weights(seed). options.dtype: the parameters' dtype. A
  // partial range (a pipeline stage) with tied embeddings is an error: the table would live on
  // two stages.
  explicit Transformer(const ModelArgs& args, uint64_t seed = 0, TensorOptions options = {},
                       LayerRange range = {});

  // tokens [B, T] (i64 or i32, values in [0, vocab_size), T <= max_seq_len) -> logits [B, T, V].
  Tensor operator()(const Tensor& tokens);
  // The same logits, but in the parameters' (compute) dtype also when that is 16-bit.
  Tensor loss_logits(const Tensor& tokens);
  // A pipeline stage's forward: tokens [B, T] (the first stage) or the previous stage's hidden
  // states [B, T, dim] -> the hidden states after its last block, or (the last stage) the
  // logits in the compute dtype, as loss_logits. On the whole model: loss_logits.
  Tensor stage_forward(const Tensor& input);
  // The blocks this module holds (global indices [begin, end)); whole: [0, n_layers).
  const LayerRange& layer_range() const { return range_; }
  bool is_whole() const { return range_.begin == 0 && range_.end == args_.n_layers; }

  // Incremental decoding, always without autograd: tokens [B, T] at positions
  // [cache.length(), cache.length() + T) -> logits [B, T, V] (as operator()); appends the tokens'
  // keys and values to `cache` and advances it by T. The prefill passes the whole prompt, then one
  // token per step. Errors (cache of another shape, cache.length() + T > cache.max_seq()) leave
  // the cache unchanged. On a pipeline stage, as stage_forward: tokens (the first stage) or the
  // previous stage's hidden states [B, T, dim] -> hidden states, or (the last stage) the logits
  // in f32; the cache holds the stage's layers alone (make_kv_cache).
  Tensor forward_cached(const Tensor& input, KVCache& cache);
  // An empty cache for this model's (or stage's) layers, for `batch` sequences of up to max_seq
  // tokens (0: args().max_seq_len), on the parameters' device, in `dtype` (default: the
  // parameters' dtype; under FSDP mixed precision the compute dtype differs from the stored
  // shards'), of kv_heads / kv_head_shards heads (tensor parallelism splits the heads).
  KVCache make_kv_cache(int64_t batch, int64_t max_seq = 0,
                        std::optional<runtime::DType> dtype = std::nullopt,
                        int64_t kv_head_shards = 1) const;

  // The TransformerBlocks `ac` names run under activation checkpointing; the others do not.
  void set_activation_checkpointing(ActivationCheckpointing ac);

  // Context parallelism: the forwards (training and stage_forward, not decoding) run on a rank's
  // share of each sequence as `shard` says, until set_sequence_shard(nullopt).
  void set_sequence_shard(const std::optional<SequenceShard>& shard);

  const ModelArgs& args() const { return args_; }

  // Null where a pipeline stage does not hold them (see LayerRange).
  std::shared_ptr<InitEmbedding> tok_embeddings;
  std::shared_ptr<nn::ModuleList> layers;  // children named by global index
  std::vector<std::shared_ptr<TransformerBlock>> blocks;  // the same modules as `layers`, typed
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<InitLinear> output;
  Tensor rope_cos, rope_sin;  // non-persistent buffers

 private:
  void check_tokens(const Tensor& tokens) const;
  void check_whole(const char* what) const;
  Tensor forward(const Tensor& input, bool f32_logits);
  Tensor logits_from_hidden(const Tensor& h, bool f32_logits);

  ModelArgs args_;
  LayerRange range_;
  Tensor positions_;  // set_sequence_shard's; undefined: the tokens are at 0, 1, ...
};

}  // namespace mt::models::llama
