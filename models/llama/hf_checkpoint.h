// Converting Llama weights between minititan and Hugging Face transformers' LlamaForCausalLM.
//
// Names: tok_embeddings.weight <-> model.embed_tokens.weight; layers.N.attention.w{q,k,v,o} <->
// model.layers.N.self_attn.{q,k,v,o}_proj; feed_forward.w1/w3/w2 <-> mlp.gate_proj/up_proj/
// down_proj; attention_norm / ffn_norm <-> input_layernorm / post_attention_layernorm; norm <->
// model.norm; output <-> lm_head (absent when the embeddings are tied).
// RoPE: minititan rotates interleaved pairs (Meta's layout), transformers rotates halves
// (rotate_half), so wq and wk rows are permuted per head exactly as transformers' own
// convert_llama_weights_to_hf does, and back on import.
// config.json carries the architecture (hidden_size, intermediate_size, heads, layers, eps,
// rope_theta and llama3 rope_scaling, vocab, max_position_embeddings, tie_word_embeddings).
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "models/llama/model_args.h"
#include "runtime/core/tensor.h"

namespace mt::models::llama {

using Weights = std::map<std::string, runtime::Tensor>;

// Our parameter names (no "model." prefix) -> transformers' names and layout. Every expected
// tensor must be present with its shape for `args` (errors name the tensor).
Weights to_hf(const Weights& ours, const ModelArgs& args);
Weights from_hf(const Weights& hf, const ModelArgs& args);

// config.json text for `args`; torch_dtype names the stored dtype ("float32", "bfloat16").
std::string hf_config_json(const ModelArgs& args, const std::string& torch_dtype);
// Reads a config.json (model_type llama) back; errors name the file and the key.
ModelArgs args_from_hf_config(const std::filesystem::path& config_json);
// The same from the file's text (e.g. kept in a checkpoint); `where` names its origin in errors.
ModelArgs args_from_hf_config_text(const std::string& text, const std::string& where);

}  // namespace mt::models::llama
