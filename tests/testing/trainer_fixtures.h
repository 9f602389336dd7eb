// Pieces the trainer tests share: a small tokenizer trained on a corpus, and a Llama shrunk so
// (or a MoE) shrunk so that a training step takes milliseconds.
#pragma once

#include <any>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/llama/model_args.h"
#include "train/trainer.h"

namespace mt::testing {

// TrainerOptions for tests: no log, no files, no signal handlers, no end-of-run sample; `edit`
// shrinks the model (edit_model_args); `world`: the ranks (null: the launch's).
train::TrainerOptions quiet_trainer_options(std::function<void(std::any&)> edit,
                                            std::shared_ptr<parallel::ProcessGroup> world = nullptr);

// The flags of the multi-rank trainer tests' short run: `corpus` tokenized with `tokenizer`,
// `local_batch` sequences of 32 tokens per rank, 8 per step, 10 steps (seed 3, lr 1e-2, max norm
// 0.5, warm-up 1) in float32, validated at steps 5 and 10 (2 batches), into `dump`.
// A run against a reference one (N ranks against one process): losses and gradient norms to
// 2e-5 relative (float reduction order), validation losses to 2e-5, and the reference trains
// (its last loss at least 0.5 below its first).
void expect_same_run(const train::TrainResult& got, const train::TrainResult& want);
// expect_same_run for MoE runs, whose load imbalance (max / mean tokens per expert, a metric of
// every step) must also match to 1e-9.
void expect_same_moe_run(const train::TrainResult& got, const train::TrainResult& want);

std::vector<std::string> short_run_flags(const std::filesystem::path& corpus,
                                         const std::filesystem::path& tokenizer,
                                         const std::filesystem::path& dump, int64_t local_batch);

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
