#include "models/moe/model.h"

#include <cmath>

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/rope.h"

namespace mt::models::moe {

using runtime::DType;

namespace {

constexpr double kInitStd = 0.02;

// The llama arguments its Attention reads (dim, heads, kv heads).
llama::ModelArgs attention_args(const ModelArgs& a) {
  llama::ModelArgs la;
  la.dim = a.dim;
  la.n_layers = a.n_layers;
  la.n_heads = a.n_heads;
  la.n_kv_heads = a.n_kv_heads;
  la.vocab_size = a.vocab_size;
  la.norm_eps = a.norm_eps;
  la.rope_theta = a.rope_theta;
  la.rope_scaling = std::nullopt;
  la.max_seq_len = a.max_seq_len;
  return la;
}

}  // namespace

TransformerBlock::TransformerBlock(int64_t layer_id_, const ModelArgs& args, TensorOptions options)
    : nn::Module("TransformerBlock"), layer_id(layer_id_) {
  const double out_std = kInitStd / std::sqrt(2.0 * double(layer_id + 1));
  attention = register_module(
      "attention", std::make_shared<llama::Attention>(attention_args(args), out_std, options));
  if (args.is_moe_layer(layer_id)) {
    moe = register_module("moe", std::make_shared<MoE>(args, out_std, options));
  } else {
    feed_forward = register_module("feed_forward", std::make_shared<llama::FeedForward>(
                                                       args.dim, args.inter_dim, out_std, options));
  }
  attention_norm = register_module("attention_norm",
                                   std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
  ffn_norm =
      register_module("ffn_norm", std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
}

std::vector<Tensor> TransformerBlock::forward(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                              llama::KVCache* cache) {
  return call_multi({x, cos, sin}, [this, cache](const std::vector<Tensor>& in) {
    const Tensor h = runtime::add(
        in[0], (*attention)((*attention_norm)(in[0]), in[1], in[2], cache, layer_id));
    if (!moe) return std::vector<Tensor>{runtime::add(h, (*feed_forward)((*ffn_norm)(h)))};
    std::vector<Tensor> out = moe->forward((*ffn_norm)(h));
    out[0] = runtime::add(h, out[0]);
    return out;
  });
}

Transformer::Transformer(const ModelArgs& args, uint64_t seed, TensorOptions options,
                         llama::LayerRange range)
    : nn::Module("Transformer"), args_(args) {
  args.validate();
  MT_CHECK(runtime::is_floating(options.dtype),
           "moe Transformer: expected a floating parameter dtype, got ", options.dtype);
  range_ = llama::resolve_layer_range(range, args.n_layers, false, "moe Transformer");
  options.requires_grad = false;
  llama::register_rope_buffers(*this, rope_cos, rope_sin, args.head_dim(), args.max_seq_len,
                               args.rope_theta, std::nullopt, options);

  if (range_.begin == 0) {
    tok_embeddings = register_module(
        "tok_embeddings",
        std::make_shared<llama::InitEmbedding>(args.vocab_size, args.dim, options));
  }
  layers = register_module("layers", std::make_shared<nn::ModuleList>());
  blocks = llama::build_blocks<TransformerBlock>(*layers, range_, [&](int64_t i) {
    return std::make_shared<TransformerBlock>(i, args, options);
  });
  if (range_.end < args.n_layers) {
    init_weights(seed);
    return;
  }
  norm = register_module("norm", std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
  const double out_std = 1.0 / std::sqrt(double(args.dim));
  output = register_module("output",
                           std::make_shared<llama::InitLinear>(args.dim, args.vocab_size, out_std,
                                                               -3 * out_std, 3 * out_std, options));
  init_weights(seed);
}

Transformer::Output Transformer::forward_with_aux(const Tensor& tokens, bool f32_logits) {
  MT_CHECK(is_whole(), "moe Transformer: the pipeline stage of layers [", range_.begin, ", ",
           range_.end, ") runs stage_forward, not the whole model's forward");
  return forward_part(tokens, f32_logits);
}

Transformer::Output Transformer::stage_forward(const Tensor& input) {
  return forward_part(input, false);
}

Tensor Transformer::forward_cached(const Tensor& input, llama::KVCache& cache) {
  llama::check_stage_input(input, tok_embeddings != nullptr, args_.dim, args_.max_seq_len, range_,
                           "moe Transformer::forward_cached");
  llama::check_cache_fits(cache, range_, attention_args(args_), input.size(0), input.size(1),
                          "moe Transformer");
  llama::check_not_sharded(positions_, "moe Transformer");
  runtime::NoGradGuard no_grad;
  return llama::forward_and_commit(cache, [&] { return forward_part(input, true, &cache).logits; });
}

llama::KVCache Transformer::make_kv_cache(int64_t batch, int64_t max_seq,
                                          std::optional<DType> dtype,
                                          int64_t kv_head_shards) const {
  // A stage without the embeddings has blocks (a range is never empty).
  const Tensor& w = tok_embeddings ? tok_embeddings->weight : blocks.front()->attention_norm->weight;
  return llama::KVCache(
      attention_args(args_), batch,
      TensorOptions{}.with_dtype(dtype.value_or(w.dtype())).with_device(w.device()), max_seq,
      range_, kv_head_shards);
}

Transformer::Output Transformer::forward_part(const Tensor& input, bool f32_logits,
                                              llama::KVCache* cache) {
  llama::check_stage_input(input, tok_embeddings != nullptr, args_.dim, args_.max_seq_len, range_,
                           "moe Transformer");
  std::vector<Tensor> out = call_multi({input}, [this, f32_logits,
                                                 cache](const std::vector<Tensor>& in) {
    const auto [cos, sin] =
        llama::rope_rows(rope_cos, rope_sin, positions_, in[0], "moe Transformer");
    Tensor h = tok_embeddings ? (*tok_embeddings)(in[0]) : in[0];
    Tensor aux;
    for (const auto& block : blocks) {
      std::vector<Tensor> o = block->forward(h, cos, sin, cache);
      h = o[0];
      if (o.size() > 1) aux = aux.defined() ? runtime::add(aux, o[1]) : o[1];
    }
    if (!output) return aux.defined() ? std::vector<Tensor>{h, aux} : std::vector<Tensor>{h};
    Tensor logits = (*output)((*norm)(h));
    const DType dt = logits.dtype();
    if (f32_logits && (dt == DType::BF16 || dt == DType::F16)) logits = logits.to(DType::F32);
    return aux.defined() ? std::vector<Tensor>{logits, aux} : std::vector<Tensor>{logits};
  });
  return Output{out[0], out.size() > 1 ? out[1] : Tensor()};
}

void Transformer::set_activation_checkpointing(llama::ActivationCheckpointing ac) {
  for (const auto& block : blocks) ac.apply(*block, block->layer_id);
}

void Transformer::set_sequence_shard(const std::optional<SequenceShard>& shard) {
  llama::set_blocks_sequence_shard(blocks, shard, positions_);
  for (const auto& moe : moe_layers()) {
    moe->set_sequence_shards(shard ? shard->shards : 1,
                             shard ? shard->sum_over_shards : nullptr);
  }
}

std::vector<std::shared_ptr<MoE>> Transformer::moe_layers() const {
  std::vector<std::shared_ptr<MoE>> out;
  for (const auto& block : blocks) {
    if (block->moe) out.push_back(block->moe);
  }
  return out;
}

}  // namespace mt::models::moe
