// Llama <-> Hugging Face conversion (models/llama/hf_checkpoint.h) at the model level: the q/k row
// permutation is transformers' formula (checked element by element) and is undone exactly;
// config.json round-trips every flavor and carries Llama 3.1's published values, and configs saved
// by transformers 4 (rope_theta, rope_scaling) and 5 (rope_parameters) import; a random model
// exported to safetensors and imported back gives bit-identical logits (GQA with llama3 RoPE
// scaling, tied MHA without scaling, MQA stored as bf16 in shards); config/tensor mismatches are
// errors naming the tensor and both shapes.
//
// With MT_HF_EXPORT_DIR set, ExportedModelsGiveIdenticalLogits also leaves each variant there
// (<variant>/hf: config.json + safetensors; <variant>/expected.safetensors: tokens and our
// logits) for scripts/verify_hf_export.py --logits, which loads them with transformers'
// LlamaForCausalLM and compares the logits (needs torch; not run in CI); the script then has
// ImportsWhatTransformersSaved import what transformers saves (MT_HF_IMPORT_DIR).
#include "models/llama/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>

#include "checkpoint/safetensors.h"
#include "models/llama/model.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/tensor_testing.h"

namespace mt::models::llama {
namespace {

namespace fs = std::filesystem;
using runtime::DType;
using testing::error_of;
using Json = nlohmann::json;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

Weights weights_of(const Transformer& model) {
  Weights w;
  for (const auto& [fqn, p] : model.named_parameters()) w[fqn] = p.detach();
  return w;
}

ModelArgs small_args() {
  ModelArgs a;
  a.dim = 64;
  a.n_layers = 2;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.vocab_size = 80;
  a.multiple_of = 32;
  a.max_seq_len = 16;
  return a;
}

TEST(HfCheckpoint, QkRowsArePermutedAsTransformersConvertScript) {
  // transformers' convert_llama_weights_to_hf: permute(w) = w.view(heads, d / heads / 2, 2, dim)
  //   .transpose(1, 2).reshape(d, dim): HF row h*hd + j*(hd/2) + i holds our row h*hd + 2i + j.
  const ModelArgs a = small_args();
  const int64_t hd = a.head_dim(), half = hd / 2;
  Weights ours = weights_of(Transformer(a, 3));
  const int64_t q_rows = a.n_heads * hd, k_rows = a.kv_heads() * hd;
  ours["layers.1.attention.wq.weight"] =
      runtime::arange(0, double(q_rows * a.dim), 1, {DType::F32}).reshape({q_rows, a.dim});
  ours["layers.1.attention.wk.weight"] =
      runtime::arange(0, double(k_rows * a.dim), 1, {DType::F32}).reshape({k_rows, a.dim});
  const Weights hf = to_hf(ours, a);
  for (const auto& [name, heads] : {std::pair{std::string("q_proj"), a.n_heads},
                                    std::pair{std::string("k_proj"), a.kv_heads()}}) {
    const Tensor w = hf.at("model.layers.1.self_attn." + name + ".weight").contiguous();
    ASSERT_EQ(w.shape(), (runtime::Shape{heads * hd, a.dim})) << name;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        for (int64_t j = 0; j < 2; ++j) {
          const int64_t hf_row = h * hd + j * half + i, our_row = h * hd + 2 * i + j;
          EXPECT_EQ(w.data<float>()[hf_row * a.dim + 5], float(our_row * a.dim + 5))
              << name << " head " << h << " pair " << i << " element " << j;
        }
      }
    }
  }
  // Only wq and wk move; everything else is the same tensor, and from_hf undoes it bit for bit.
  EXPECT_TRUE(bitwise_equal(hf.at("model.layers.1.self_attn.v_proj.weight"),
                            ours.at("layers.1.attention.wv.weight")));
  const Weights back = from_hf(hf, a);
  ASSERT_EQ(back.size(), ours.size());
  for (const auto& [name, t] : ours) EXPECT_TRUE(bitwise_equal(back.at(name), t)) << name;
}

TEST(HfCheckpoint, ConfigRoundTripsEveryFlavorWithThePublishedValues) {
  for (const std::string& flavor : flavor_names()) {
    SCOPED_TRACE(flavor);
    testing::ScratchDir scratch;
    const ModelArgs a = flavor_args(flavor);
    std::ofstream(scratch / "config.json") << hf_config_json(a, "bfloat16");
    const ModelArgs b = args_from_hf_config(scratch / "config.json");
    EXPECT_EQ(b.dim, a.dim);
    EXPECT_EQ(b.n_layers, a.n_layers);
    EXPECT_EQ(b.n_heads, a.n_heads);
    EXPECT_EQ(b.kv_heads(), a.kv_heads());
    EXPECT_EQ(b.vocab_size, a.vocab_size);
    EXPECT_EQ(b.ffn_hidden_dim(), a.ffn_hidden_dim());
    EXPECT_EQ(b.norm_eps, a.norm_eps);
    EXPECT_EQ(b.rope_theta, a.rope_theta);
    EXPECT_EQ(b.max_position_embeddings, a.max_position_embeddings);
    EXPECT_EQ(b.tie_embeddings, a.tie_embeddings);
    ASSERT_EQ(b.rope_scaling.has_value(), a.rope_scaling.has_value());
    if (a.rope_scaling) {
      EXPECT_EQ(b.rope_scaling->factor, a.rope_scaling->factor);
      EXPECT_EQ(b.rope_scaling->low_freq_factor, a.rope_scaling->low_freq_factor);
      EXPECT_EQ(b.rope_scaling->high_freq_factor, a.rope_scaling->high_freq_factor);
      EXPECT_EQ(b.rope_scaling->original_max_position_embeddings,
                a.rope_scaling->original_max_position_embeddings);
    }
  }
  // Meta-Llama-3.1-8B's and Llama-3.2-1B's config.json (the fields both models define).
  const Json j8 = Json::parse(hf_config_json(flavor_args("8B"), "bfloat16"));
  EXPECT_EQ(j8["architectures"], Json({"LlamaForCausalLM"}));
  EXPECT_EQ(j8["model_type"], "llama");
  EXPECT_EQ(j8["hidden_size"], 4096);
  EXPECT_EQ(j8["intermediate_size"], 14336);
  EXPECT_EQ(j8["num_attention_heads"], 32);
  EXPECT_EQ(j8["num_key_value_heads"], 8);
  EXPECT_EQ(j8["num_hidden_layers"], 32);
  EXPECT_EQ(j8["rms_norm_eps"], 1e-5);
  EXPECT_EQ(j8["rope_theta"], 500000.0);
  EXPECT_EQ(j8["vocab_size"], 128256);
  EXPECT_EQ(j8["tie_word_embeddings"], false);
  EXPECT_EQ(j8["torch_dtype"], "bfloat16");
  EXPECT_EQ(j8["rope_scaling"], Json({{"rope_type", "llama3"},
                                      {"factor", 8.0},
                                      {"low_freq_factor", 1.0},
                                      {"high_freq_factor", 4.0},
                                      {"original_max_position_embeddings", 8192}}));
  const Json j1 = Json::parse(hf_config_json(flavor_args("1B"), "bfloat16"));
  EXPECT_EQ(j1["hidden_size"], 2048);
  EXPECT_EQ(j1["intermediate_size"], 8192);
  EXPECT_EQ(j1["num_hidden_layers"], 16);
  EXPECT_EQ(j1["tie_word_embeddings"], true);
  EXPECT_EQ(j1["rope_scaling"]["factor"], 32.0);
  EXPECT_EQ(Json::parse(hf_config_json(flavor_args("70B"), "bfloat16"))["intermediate_size"],
            28672);
  EXPECT_EQ(Json::parse(hf_config_json(flavor_args("405B"), "bfloat16"))["intermediate_size"],
            53248);
}

ModelArgs args_from_text(const std::string& text) {
  return args_from_hf_config_text(text, "test config");
}

TEST(HfCheckpoint, ConfigsSavedByTransformers4And5Import) {
  // Meta-Llama-3.1-8B's config.json (transformers 4: rope_theta beside rope_scaling).
  const ModelArgs v4 = args_from_text(R"({"architectures": ["LlamaForCausalLM"],
      "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
      "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
      "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
      "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
      "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
      "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
      "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
      "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})");
  const ModelArgs want = flavor_args("8B");
  EXPECT_EQ(v4.dim, want.dim);
  EXPECT_EQ(v4.ffn_hidden_dim(), want.ffn_hidden_dim());
  EXPECT_EQ(v4.kv_heads(), want.kv_heads());
  EXPECT_EQ(v4.rope_theta, 500000.0);
  ASSERT_TRUE(v4.rope_scaling.has_value());
  EXPECT_EQ(v4.rope_scaling->factor, 8.0);
  EXPECT_EQ(v4.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(v4.max_seq_len, 131072);
  // What transformers 5.23's LlamaConfig.save_pretrained writes: rope_parameters holds theta.
  const std::string v5_text = R"({"attention_bias": false, "head_dim": 16, "hidden_act": "silu",
      "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 131072,
      "mlp_bias": false, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 1,
      "num_key_value_heads": 4, "pad_token_id": null, "rms_norm_eps": 1e-06,
      "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192, "rope_theta": 12345.0, "rope_type": "llama3"},
      "tie_word_embeddings": false, "transformers_version": "5.23.0", "vocab_size": 10})";
  const ModelArgs v5 = args_from_text(v5_text);
  EXPECT_EQ(v5.rope_theta, 12345.0);
  ASSERT_TRUE(v5.rope_scaling.has_value());
  EXPECT_EQ(v5.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(v5.norm_eps, 1e-6);
  EXPECT_EQ(v5.ffn_hidden_dim(), 128);
  const ModelArgs plain = args_from_text(R"({"model_type": "llama", "hidden_size": 64,
      "intermediate_size": 96, "num_attention_heads": 4, "num_hidden_layers": 1,
      "num_key_value_heads": null, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
      "vocab_size": 10, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})");
  EXPECT_FALSE(plain.rope_scaling.has_value());
  EXPECT_EQ(plain.kv_heads(), 4);
  EXPECT_EQ(plain.ffn_hidden_dim(), 96);

  // Architectures minititan's Llama cannot run are refused, naming the key.
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = v5_text;
    text.replace(text.find(from), from.size(), to);
    return error_of([&] { args_from_text(text); });
  };
  EXPECT_NE(with(R"("hidden_act": "silu")", R"("hidden_act": "gelu")")
                .find("test config: hidden_act \"gelu\" is not supported (silu only)"),
            std::string::npos);
  EXPECT_NE(with(R"("mlp_bias": false)", R"("mlp_bias": true)")
                .find("mlp_bias is true; minititan's Llama has no biases"),
            std::string::npos);
  EXPECT_NE(with(R"("rope_type": "llama3")", R"("rope_type": "yarn")")
                .find("test config, rope_parameters: rope_type \"yarn\" is not supported"),
            std::string::npos);
  EXPECT_NE(with(R"("rope_theta": 12345.0, )", "")
                .find("test config, rope_parameters: missing key \"rope_theta\""),
            std::string::npos);
  EXPECT_NE(with(R"("head_dim": 16)", R"("head_dim": 32)")
                .find("head_dim x num_attention_heads must equal hidden_size"),
            std::string::npos);
}

struct Variant {
  std::string name;
  ModelArgs args;
  DType dtype;              // stored dtype of the export
  int64_t max_shard_bytes;  // small: several shards
};

std::vector<Variant> variants() {
  // llama3 RoPE scaling with a short original context, so that it changes most frequencies of
  // head_dim 32 within the 24 tokens compared (8192 would move only the slowest, invisibly).
  ModelArgs gqa;
  gqa.rope_scaling = runtime::RopeScaling{.factor = 4.0,
                                          .low_freq_factor = 1.0,
                                          .high_freq_factor = 2.0,
                                          .original_max_position_embeddings = 16};
  gqa.dim = 128;
  gqa.n_layers = 2;
  gqa.n_heads = 4;
  gqa.n_kv_heads = 2;
  gqa.vocab_size = 256;
  gqa.multiple_of = 64;
  gqa.max_seq_len = 32;
  ModelArgs tied = gqa;
  tied.n_kv_heads = 0;
  tied.tie_embeddings = true;
  tied.rope_scaling = std::nullopt;
  tied.rope_theta = 10000.0;
  tied.norm_eps = 1e-6;
  tied.ffn_dim_multiplier = 1.3;
  ModelArgs mqa = gqa;
  mqa.n_kv_heads = 1;
  mqa.n_layers = 3;
  return {{"gqa_rope_scaled_f32", gqa, DType::F32, int64_t(1) << 30},
          {"tied_mha_f32", tied, DType::F32, int64_t(1) << 30},
          {"mqa_bf16_sharded", mqa, DType::BF16, 300'000}};
}

// Replaces the initial weights (attention nearly uniform, blocks adding little to the residual,
// norms all ones) by ones under which every mapping matters: matrices randn / sqrt(fan_in) (O(1)
// attention scores and block outputs), norm weights 1 + randn / 4 (so that swapping two norms, or
// the final norm, changes the logits).
void make_every_weight_matter(Transformer& model) {
  for (const auto& [fqn, p] : model.named_parameters()) {
    const Tensor r = testing::randn_as(p.shape(), DType::F32, 11, fqn);
    if (fqn == "tok_embeddings.weight") continue;
    p.copy_(p.dim() == 1 ? r * 0.25 + 1.0 : r * (1.0 / std::sqrt(double(p.size(1)))));
  }
}

// Fixed tokens [2, T] covering the vocabulary.
Tensor fixed_tokens(int64_t vocab, int64_t T) {
  std::vector<int64_t> ids(2 * T);
  for (int64_t i = 0; i < 2 * T; ++i) ids[i] = (i * 37 + 11) % vocab;
  return runtime::from_i64(ids, {2, T}, {DType::I64});
}

// A Transformer built from hf_dir's config.json holding its weights (copied by
// named_parameters, a tied table once, as mt_generate loads checkpoints), and those weights.
std::pair<std::unique_ptr<Transformer>, Weights> import_model(const fs::path& hf_dir) {
  const ModelArgs args = args_from_hf_config(hf_dir / "config.json");
  Weights weights = from_hf(checkpoint::read_safetensors_folder(hf_dir), args);
  auto model = std::make_unique<Transformer>(args, 99);
  for (const auto& [fqn, p] : model->named_parameters()) p.copy_(weights.at(fqn));
  return {std::move(model), std::move(weights)};
}

TEST(HfCheckpoint, ExportedModelsGiveIdenticalLogits) {
  runtime::NoGradGuard no_grad;
  const char* keep = std::getenv("MT_HF_EXPORT_DIR");
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    testing::ScratchDir scratch;
    const fs::path hf_dir = keep ? fs::path(keep) / v.name / "hf" : scratch / v.name / "hf";
    Transformer model(v.args, 7);
    make_every_weight_matter(model);
    const Weights ours = weights_of(model);
    Weights hf = to_hf(ours, v.args);
    for (auto& [name, t] : hf) t = t.to(v.dtype);
    const auto files = checkpoint::write_safetensors_folder(hf_dir, hf, v.max_shard_bytes);
    EXPECT_EQ(files.size() > 1, v.max_shard_bytes < (int64_t(1) << 30));
    std::ofstream(hf_dir / "config.json")
        << hf_config_json(v.args, v.dtype == DType::BF16 ? "bfloat16" : "float32");

    // Import: the config alone rebuilds the architecture; the weights load into a fresh model.
    const auto [imported, back] = import_model(hf_dir);
    ASSERT_EQ(back.size(), ours.size());
    for (const auto& [name, t] : back) {
      EXPECT_TRUE(bitwise_equal(t, ours.at(name).to(v.dtype))) << name;
    }
    const Tensor tokens = fixed_tokens(v.args.vocab_size, 24);
    const Tensor logits = (*imported)(tokens);
    if (v.dtype == DType::F32) {
      EXPECT_TRUE(bitwise_equal(logits, model(tokens))) << "logits differ after export/import";
    } else {
      EXPECT_TRUE(testing::all_close(logits, model(tokens), 0.05, 0.05)) << "bf16 rounding only";
    }
    if (keep) {
      checkpoint::write_safetensors(fs::path(keep) / v.name / "expected.safetensors",
                                    {{"tokens", tokens}, {"logits", logits.contiguous()}});
    }
  }
}

// The other direction, run by scripts/verify_hf_export.py --logits after transformers'
// save_pretrained re-saved each export as <variant>/resaved (transformers' own safetensors and
// config.json, e.g. rope_parameters in transformers 5): imports it and writes our logits for
// the expected tokens into <variant>/imported.safetensors, which the script compares with
// transformers' logits.
TEST(HfCheckpoint, ImportsWhatTransformersSaved) {
  const char* dir = std::getenv("MT_HF_IMPORT_DIR");
  if (!dir) GTEST_SKIP() << "run by scripts/verify_hf_export.py --logits (needs transformers)";
  runtime::NoGradGuard no_grad;
  int imported = 0;
  for (const auto& variant : fs::directory_iterator(dir)) {
    if (!fs::exists(variant.path() / "resaved" / "config.json")) continue;
    SCOPED_TRACE(variant.path().string());
    const auto [model, weights] = import_model(variant.path() / "resaved");
    const Tensor tokens =
        checkpoint::read_safetensors(variant.path() / "expected.safetensors").at("tokens");
    checkpoint::write_safetensors(variant.path() / "imported.safetensors",
                                  {{"logits", (*model)(tokens).contiguous()}});
    ++imported;
  }
  EXPECT_GT(imported, 0) << "no <variant>/resaved folders in " << dir;
}

TEST(HfCheckpoint, MismatchesAreErrorsNamingTheTensorAndShapes) {
  const ModelArgs a = small_args();
  const Weights hf = to_hf(weights_of(Transformer(a, 1)), a);
  ModelArgs wider = a;
  wider.multiple_of = 64;  // FFN 384 instead of 192
  wider.ffn_dim_multiplier = 2.0;
  EXPECT_NE(error_of([&] { from_hf(hf, wider); })
                .find("tensor model.layers.0.mlp.gate_proj.weight has shape [192, 64], the model's "
                      "args give [384, 64]"),
            std::string::npos)
      << error_of([&] { from_hf(hf, wider); });
  ModelArgs mha = a;
  mha.n_kv_heads = 0;
  EXPECT_NE(error_of([&] { from_hf(hf, mha); })
                .find("tensor model.layers.0.self_attn.k_proj.weight has shape [32, 64], the "
                      "model's args give [64, 64]"),
            std::string::npos);
  ModelArgs tied = a;
  tied.tie_embeddings = true;  // a tied config still accepts (and drops) a stored lm_head
  EXPECT_EQ(from_hf(hf, tied).count("output.weight"), 0u);
  Weights missing = hf;
  missing.erase("model.layers.1.post_attention_layernorm.weight");
  EXPECT_NE(error_of([&] {
              from_hf(missing, a);
            }).find("tensor model.layers.1.post_attention_layernorm.weight is missing"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::models::llama
