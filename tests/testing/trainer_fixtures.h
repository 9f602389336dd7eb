// Pieces the trainer tests share: a small tokenizer trained on a corpus, and a Llama shrunk so
// (or a MoE) shrunk so that a training step takes milliseconds.
#pragma once

#include <any>
#include <filesystem>

namespace mt::testing {

// Trains a 512-token BPE tokenizer on the first 200 kB of `corpus` and saves it into `dir`.
void save_small_tokenizer(const std::filesystem::path& corpus, const std::filesystem::path& dir);

// TrainerOptions::edit_model_args for llama3: dim 64, 2 layers, 4 heads (2 KV heads).
void shrink_llama(std::any& model_args);
// TrainerOptions::edit_model_args for deepseek_v3 moe_debug: 3 blocks (the first dense), 8
// experts of hidden 32, top 2, one shared expert.
void shrink_moe(std::any& model_args);

}  // namespace mt::testing
