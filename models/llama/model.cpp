#include "models/llama/model.h"

#include <charconv>
#include <cmath>
#include <tuple>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/float8.h"
#include "runtime/ops/index.h"
#include "runtime/ops/join.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/rope.h"
#include "runtime/ops/swiglu.h"

namespace mt::models::llama {

using runtime::DType;

namespace {
constexpr double kInitStd = 0.02;
constexpr double kTruncBound = 2.0;  // torch.nn.init.trunc_normal_'s default absolute [-2, 2]
}  // namespace

// ---- init-aware layers ---------------------------------------------------------------------

InitLinear::InitLinear(int64_t in, int64_t out, double std, double lo, double hi,
                       TensorOptions options)
    : nn::Linear(in, out, /*bias=*/false, options), std_(std), lo_(lo), hi_(hi) {}

void InitLinear::reset_parameters(const nn::InitContext& ctx) {
  if (skip_init) return;
  nn::init_trunc_normal_(weight, ctx.key("weight"), 0.0, std_, lo_, hi_);
}

InitEmbedding::InitEmbedding(int64_t vocab, int64_t dim, TensorOptions options)
    : nn::Embedding(vocab, dim, options) {}

void InitEmbedding::reset_parameters(const nn::InitContext& ctx) {
  if (tied_std > 0) {
    nn::init_trunc_normal_(weight, ctx.key("weight"), 0.0, tied_std, -3 * tied_std, 3 * tied_std);
  } else {
    nn::init_normal_(weight, ctx.key("weight"), 0.0, 1.0);
  }
}

// ---- attention -----------------------------------------------------------------------------

Attention::Attention(const ModelArgs& args, double out_init_std, TensorOptions options)
    : nn::Module("Attention"),
      n_heads_(args.n_heads),
      n_kv_heads_(args.kv_heads()),
      head_dim_(args.head_dim()) {
  const int64_t d = args.dim, kv = n_kv_heads_ * head_dim_, q = n_heads_ * head_dim_;
  auto lin = [&](int64_t in, int64_t out, double std) {
    return std::make_shared<InitLinear>(in, out, std, -kTruncBound, kTruncBound, options);
  };
  wq = register_module("wq", lin(d, q, kInitStd));
  wk = register_module("wk", lin(d, kv, kInitStd));
  wv = register_module("wv", lin(d, kv, kInitStd));
  wo = register_module("wo", lin(q, d, out_init_std));
}

Tensor Attention::operator()(const Tensor& x, const Tensor& cos, const Tensor& sin, KVCache* cache,
                             int64_t layer) {
  return call({x, cos, sin}, [this, cache, layer](const std::vector<Tensor>& in) {
    const Tensor& h = in[0];
    const int64_t b = h.size(0), t = h.size(1);
    const int64_t pos = cache != nullptr ? cache->length() : 0;
    const std::vector<Tensor> qkv = project_qkv(h);
    // [B, T, H, D]: RoPE works per (token, head); attention wants [B, H, T, D]. The head counts
    // come from the projections (-1), which hold a part of the heads under tensor parallelism.
    Tensor xq = qkv[0].view({b, t, -1, head_dim_});
    Tensor xk = qkv[1].view({b, t, -1, head_dim_});
    Tensor xv = qkv[2].view({b, t, -1, head_dim_});
    xq = runtime::apply_rope(xq, in[1], in[2], pos);
    xk = runtime::apply_rope(xk, in[1], in[2], pos);
    Tensor keys = xk.transpose(1, 2), values = xv.transpose(1, 2);
    // Cached: the queries at [pos, pos + t) see keys [0, pos + t); the causal mask is aligned
    // bottom-right, so query i sees keys j <= pos + i.
    if (cache != nullptr) std::tie(keys, values) = cache->append(layer, keys, values);
    Tensor out = core_attention && cache == nullptr
                     ? core_attention(xq.transpose(1, 2), keys, values)
                     : runtime::scaled_dot_product_attention(xq.transpose(1, 2), keys, values,
                                                             /*causal=*/true);
    return (*wo)(out.transpose(1, 2).reshape({b, t, -1}));
  });
}

// wq, wk and wv stay separate parameters (checkpoints, FSDP and Hugging Face see them as ever).
// On the CPU they are joined for one GEMM, which OpenBLAS runs faster than three (the ~20M
// model's step +2-3%); on a GPU, three GEMMs: cuBLASLt ran the joined N = q + 2 kv GEMM slower
// than the three together (H100, 1B shapes: 167.6 us with the join against 160.1 us; the 1B's
// step 0.7% slower, bench/RESULTS.md). Float8 layers run their own GEMMs (each its own weight
// scale) on one cast of h.
std::vector<Tensor> Attention::project_qkv(const Tensor& h) {
  if (!h.device().is_cpu() || wq->float8) {
    runtime::Float8InputCastSharing share_cast;
    return {(*wq)(h), (*wk)(h), (*wv)(h)};
  }
  const int64_t q_dim = wq->weight.size(0), kv_dim = wk->weight.size(0);  // this rank's heads
  std::vector<Tensor> qkv = runtime::split(
      runtime::linear(h, runtime::cat({wq->weight, wk->weight, wv->weight}, 0)),
      {q_dim, kv_dim, kv_dim}, -1);
  // v on its own: attention keeps it for backward, and a view would keep the whole joined output
  // alive (RoPE copies q and k anyway).
  qkv[2] = qkv[2].contiguous();
  return qkv;
}

// ---- feed-forward --------------------------------------------------------------------------

FeedForward::FeedForward(int64_t dim, int64_t hidden_dim, double out_init_std,
                         TensorOptions options)
    : nn::Module("FeedForward") {
  auto lin = [&](int64_t in, int64_t out, double std) {
    return std::make_shared<InitLinear>(in, out, std, -kTruncBound, kTruncBound, options);
  };
  w1 = register_module("w1", lin(dim, hidden_dim, kInitStd));
  w2 = register_module("w2", lin(hidden_dim, dim, out_init_std));
  w3 = register_module("w3", lin(dim, hidden_dim, out_init_std));
}

Tensor FeedForward::operator()(const Tensor& x) {
  return call({x}, [this](const std::vector<Tensor>& in) {
    Tensor gate, up;
    {
      runtime::Float8InputCastSharing share_cast;  // float8 w1 and w3 cast x once
      gate = (*w1)(in[0]);
      up = (*w3)(in[0]);
    }
    return (*w2)(runtime::swiglu(gate, up));
  });
}

// ---- block ---------------------------------------------------------------------------------

TransformerBlock::TransformerBlock(int64_t layer_id_, const ModelArgs& args, TensorOptions options)
    : nn::Module("TransformerBlock"), layer_id(layer_id_) {
  const double out_std = args.depth_init ? kInitStd / std::sqrt(2.0 * double(layer_id + 1))
                                         : kInitStd / std::sqrt(2.0 * double(args.n_layers));
  attention = register_module("attention", std::make_shared<Attention>(args, out_std, options));
  feed_forward = register_module(
      "feed_forward",
      std::make_shared<FeedForward>(args.dim, args.ffn_hidden_dim(), out_std, options));
  attention_norm = register_module("attention_norm",
                                   std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
  ffn_norm =
      register_module("ffn_norm", std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
}

Tensor TransformerBlock::operator()(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                    KVCache* cache) {
  return call({x, cos, sin}, [this, cache](const std::vector<Tensor>& in) {
    Tensor h =
        runtime::add(in[0], (*attention)((*attention_norm)(in[0]), in[1], in[2], cache, layer_id));
    return runtime::add(h, (*feed_forward)((*ffn_norm)(h)));
  });
}

ActivationCheckpointing parse_activation_checkpointing(const std::string& spec) {
  if (spec == "none") return {0};
  if (spec == "full") return {1};
  const std::string prefix = "selective:";
  if (spec == prefix + "op") return {1, true};
  if (spec.starts_with(prefix)) {
    const std::string n = spec.substr(prefix.size());
    int64_t period = 0;
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), period);
    if (ec == std::errc() && end == n.data() + n.size() && period > 0) return {period};
  }
  MT_FAIL("activation_checkpoint: unknown setting '", spec,
          "'; valid: none, full, selective:N (every N-th block, N > 0), selective:op");
}

void ActivationCheckpointing::apply(nn::Module& block, int64_t index) const {
  using runtime::autograd::matmul_and_attention_policy;
  block.set_activation_checkpointing(checkpoints(index),
                                     keep_ops ? matmul_and_attention_policy() : nullptr);
}

// ---- transformer ---------------------------------------------------------------------------

void register_rope_buffers(nn::Module& model, Tensor& cos, Tensor& sin, int64_t head_dim,
                           int64_t max_seq_len, double theta,
                           std::optional<runtime::RopeScaling> scaling,
                           const runtime::TensorOptions& options) {
  const runtime::RopeTables rope =
      runtime::rope_frequencies(head_dim, max_seq_len, theta, std::move(scaling));
  const DType table_dtype = options.dtype == DType::F64 ? DType::F64 : DType::F32;
  cos = rope.cos.to(table_dtype).to(options.device);
  sin = rope.sin.to(table_dtype).to(options.device);
  model.register_buffer("rope_cos", cos, /*persistent=*/false);
  model.register_buffer("rope_sin", sin, /*persistent=*/false);
}

Transformer::Transformer(const ModelArgs& args, uint64_t seed, TensorOptions options,
                         LayerRange range)
    : nn::Module("Transformer"), args_(args), range_(range) {
  args.validate();
  MT_CHECK(runtime::is_floating(options.dtype),
           "llama Transformer: expected a floating parameter dtype, got ", options.dtype);
  range_ = resolve_layer_range(range_, args.n_layers, args.tie_embeddings, "llama Transformer");
  options.requires_grad = false;
  register_rope_buffers(*this, rope_cos, rope_sin, args.head_dim(), args.max_seq_len,
                        args.rope_theta, args.rope_scaling, options);

  if (range_.begin == 0) {
    tok_embeddings = register_module(
        "tok_embeddings", std::make_shared<InitEmbedding>(args.vocab_size, args.dim, options));
  }
  layers = register_module("layers", std::make_shared<nn::ModuleList>());
  blocks = build_blocks<TransformerBlock>(*layers, range_, [&](int64_t i) {
    return std::make_shared<TransformerBlock>(i, args, options);
  });
  if (range_.end < args.n_layers) {
    init_weights(seed);
    return;
  }
  norm = register_module("norm", std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
  const double out_std = 1.0 / std::sqrt(double(args.dim));
  output =
      register_module("output", std::make_shared<InitLinear>(args.dim, args.vocab_size, out_std,
                                                             -3 * out_std, 3 * out_std, options));
  if (args.tie_embeddings) {
    output->weight = tok_embeddings->weight;  // one tensor in two slots
    output->skip_init = true;
    tok_embeddings->tied_std = out_std;
  }
  init_weights(seed);
}

std::pair<Tensor, Tensor> rope_rows(const Tensor& cos, const Tensor& sin, const Tensor& positions,
                                    const Tensor& input, const char* model) {
  if (!positions.defined()) return {cos, sin};
  // Tokens are the shard's whole share; hidden states (a later pipeline stage's input) may be
  // split further by sequence parallelism, and are gathered back before attention.
  const bool tokens = input.dim() == 2;
  MT_CHECK(positions.dim() == 1 && (!tokens || positions.size(0) == input.size(1)), model,
           ": its sequence shard holds the positions of ", positions.numel(),
           " tokens, but the input has ", input.size(1));
  return {runtime::index_select(cos, 0, positions), runtime::index_select(sin, 0, positions)};
}

void check_not_sharded(const Tensor& positions, const char* model) {
  MT_CHECK(!positions.defined(), model, ": decoding runs on whole sequences; clear the sequence "
           "shard (set_sequence_shard(std::nullopt)) first");
}

void check_token_batch(const Tensor& tokens, int64_t max_seq_len, const char* model) {
  MT_CHECK(tokens.defined() && tokens.dim() == 2 &&
               (tokens.dtype() == DType::I64 || tokens.dtype() == DType::I32),
           model, ": expected tokens [B, T] of i64 or i32, got ",
           tokens.defined() ? tokens.shape() : runtime::Shape{}, " ",
           tokens.defined() ? runtime::dtype_name(tokens.dtype()) : "undefined");
  MT_CHECK(tokens.size(1) >= 1 && tokens.size(1) <= max_seq_len, model, ": sequence length ",
           tokens.size(1), " outside [1, max_seq_len = ", max_seq_len, "] (tokens of shape ",
           tokens.shape(), ")");
}

void Transformer::check_tokens(const Tensor& tokens) const {
  check_token_batch(tokens, args_.max_seq_len, "llama Transformer");
}

LayerRange resolve_layer_range(LayerRange range, int64_t n_layers, bool tied_embeddings,
                               const char* model) {
  if (range.end < 0) range.end = n_layers;
  MT_CHECK(0 <= range.begin && range.begin < range.end && range.end <= n_layers, model,
           ": layer range [", range.begin, ", ", range.end, ") is not a non-empty part of the ",
           "model's ", n_layers, " layers");
  MT_CHECK(!tied_embeddings || (range.begin == 0 && range.end == n_layers), model,
           ": tied embeddings cannot be split into pipeline stages (the table is both the first "
           "stage's embedding and the last stage's output); layer range [",
           range.begin, ", ", range.end, ") of ", n_layers);
  return range;
}

void check_stage_input(const Tensor& input, bool tokens, int64_t dim, int64_t max_seq_len,
                       const LayerRange& range, const char* model) {
  if (tokens) return check_token_batch(input, max_seq_len, model);
  MT_CHECK(input.defined() && input.dim() == 3 && input.size(2) == dim &&
               runtime::is_floating(input.dtype()) && input.size(1) <= max_seq_len,
           model, ": the pipeline stage of layers [", range.begin, ", ", range.end,
           ") expected hidden states [B, T <= ", max_seq_len, ", ", dim,
           "] of a floating dtype, got ", input.defined() ? input.shape() : runtime::Shape{},
           input.defined() ? " " : "", input.defined() ? runtime::dtype_name(input.dtype()) : "");
}

void Transformer::check_whole(const char* what) const {
  MT_CHECK(is_whole(), "llama Transformer::", what, ": needs the whole model, this one is the "
           "pipeline stage of layers [", range_.begin, ", ", range_.end, ") of ", args_.n_layers);
}

Tensor Transformer::logits_from_hidden(const Tensor& h, bool f32_logits) {
  Tensor logits = (*output)((*norm)(h));
  const DType dt = logits.dtype();
  return f32_logits && (dt == DType::BF16 || dt == DType::F16) ? logits.to(DType::F32) : logits;
}

Tensor Transformer::forward(const Tensor& input, bool f32_logits) {
  check_stage_input(input, tok_embeddings != nullptr, args_.dim, args_.max_seq_len, range_,
                    "llama Transformer");
  return call({input}, [this, f32_logits](const std::vector<Tensor>& in) {
    const auto [cos, sin] =
        rope_rows(rope_cos, rope_sin, positions_, in[0], "llama Transformer");
    Tensor h = tok_embeddings ? (*tok_embeddings)(in[0]) : in[0];
    for (const auto& block : blocks) h = (*block)(h, cos, sin);
    return output ? logits_from_hidden(h, f32_logits) : h;
  });
}

Tensor Transformer::operator()(const Tensor& tokens) {
  check_whole("operator()");
  return forward(tokens, true);
}

Tensor Transformer::loss_logits(const Tensor& tokens) {
  check_whole("loss_logits");
  return forward(tokens, false);
}

Tensor Transformer::stage_forward(const Tensor& input) { return forward(input, false); }

Tensor Transformer::forward_cached(const Tensor& input, KVCache& cache) {
  check_stage_input(input, tok_embeddings != nullptr, args_.dim, args_.max_seq_len, range_,
                    "llama Transformer::forward_cached");
  check_cache_fits(cache, range_, args_, input.size(0), input.size(1), "llama Transformer");
  check_not_sharded(positions_, "llama Transformer");
  runtime::NoGradGuard no_grad;
  return forward_and_commit(cache, [&] {
    return call({input}, [this, &cache](const std::vector<Tensor>& in) {
      Tensor h = tok_embeddings ? (*tok_embeddings)(in[0]) : in[0];
      for (const auto& block : blocks) h = (*block)(h, rope_cos, rope_sin, &cache);
      return output ? logits_from_hidden(h, true) : h;
    });
  });
}

KVCache Transformer::make_kv_cache(int64_t batch, int64_t max_seq, std::optional<DType> dtype,
                                   int64_t kv_head_shards) const {
  // A stage without the embeddings has blocks (a range is never empty).
  const Tensor& w = tok_embeddings ? tok_embeddings->weight : blocks.front()->attention_norm->weight;
  return KVCache(args_, batch,
                 TensorOptions{}.with_dtype(dtype.value_or(w.dtype())).with_device(w.device()),
                 max_seq, range_, kv_head_shards);
}

void Transformer::set_activation_checkpointing(ActivationCheckpointing ac) {
  for (const auto& block : blocks) ac.apply(*block, block->layer_id);
}

void Transformer::set_sequence_shard(const std::optional<SequenceShard>& shard) {
  set_blocks_sequence_shard(blocks, shard, positions_);
}

}  // namespace mt::models::llama
