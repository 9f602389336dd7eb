// Pieces the trainer tests share: a small tokenizer trained on a corpus, and a Llama shrunk so
// (or a MoE) shrunk so that a training step takes milliseconds.
#pragma once

#include <any>
#include <cstdint>
#include <filesystem>

#include "models/llama/model_args.h"

namespace mt::testing {

// Trains a 512-token BPE tokenizer on the first 200 kB of `corpus` and saves it into `dir`.
void save_small_tokenizer(const std::filesystem::path& corpus, const std::filesystem::path& dir);

// TrainerOptions::edit_model_args for llama3: dim 64, 2 layers, 4 heads (2 KV heads).
void shrink_llama(std::any& model_args);
// TrainerOptions::edit_model_args for deepseek_v3 moe_debug: 3 blocks (the first dense), 8
// experts of hidden 32, top 2, one shared expert.
void shrink_moe(std::any& model_args);

// A Llama of a shape no flavor has, with transformers' defaults where Llama 3 differs: dim 96,
// 3 layers, 6 heads / 2 KV heads, FFN 256, eps 1e-6, RoPE theta 10000 without scaling, tied
// embeddings, max_position_embeddings 256.
models::llama::ModelArgs unusual_llama_args(int64_t vocab_size);

// A Hugging Face folder (config.json + model.safetensors, as transformers saves) holding
// llama::Transformer(args, seed)'s weights.
void save_random_hf_llama(const models::llama::ModelArgs& args, uint64_t seed,
                          const std::filesystem::path& hf_dir);

}  // namespace mt::testing
