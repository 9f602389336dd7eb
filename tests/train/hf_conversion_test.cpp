// Hugging Face conversion: a Llama checkpoint exported to safetensors (sharded) and imported back
// is bit-identical; the q/k row permutation turns our interleaved RoPE into transformers'
// rotate_half RoPE (attention scores equal, checked against a rotate_half written here); bad
// folders and files are errors naming what is wrong; Python's safetensors reads our files.
#include "train/hf_conversion.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "checkpoint/consolidate.h"
#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/safetensors.h"
#include "models/llama/hf_checkpoint.h"
#include "models/registry.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/grad_mode.h"
#include "runtime/nn/module.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/rope.h"
#include "tests/testing/errors.h"
#include "tests/testing/python_env.h"
#include "tests/testing/run_command.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/tensor_testing.h"
#include "tests/testing/trainer_fixtures.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
namespace llama = models::llama;
using runtime::DType;
using runtime::Tensor;

llama::ModelArgs small_args() {
  models::ModelSpec spec = models::get_model_spec("llama3", "debugmodel");
  testing::shrink_llama(*spec.args);
  auto a = std::any_cast<llama::ModelArgs>(*spec.args);
  a.vocab_size = 96;
  a.max_seq_len = 32;
  return a;
}

// A freshly initialised small Llama saved as a one-rank checkpoint; returns its weights.
llama::Weights save_model(const fs::path& dir, const llama::ModelArgs& args) {
  models::ModelSpec spec = models::get_model_spec("llama3", "debugmodel");
  *spec.args = args;
  auto model = spec.build({.seed = 5});
  llama::Weights weights;
  checkpoint::CheckpointState state;
  for (const auto& [fqn, p] : model->named_parameters()) {
    weights[fqn] = p.detach();
    state.tensors.push_back(checkpoint::whole("model." + fqn, p.detach()));
  }
  auto world = parallel::MpiProcessGroup::world();
  checkpoint::save_checkpoint(dir, state, *world);
  return weights;
}

void expect_bitwise(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  EXPECT_EQ(std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()), 0) << what;
}

TEST(HfConversion, ExportImportRoundTripsBitwiseThroughShards) {
  testing::ScratchDir scratch;
  const llama::ModelArgs args = small_args();
  const llama::Weights weights = save_model(scratch / "ckpt" / "step-3", args);
  HfExportOptions options;
  options.args = args;
  options.max_shard_bytes = 40'000;  // several shards and the index json
  export_hf(scratch / "ckpt" / "step-3", scratch / "hf", options);
  EXPECT_TRUE(fs::exists(scratch / "hf" / "model.safetensors.index.json"));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(scratch / "hf")) {
    shards += e.path().filename().string().starts_with("model-");
  }
  EXPECT_GE(shards, 2);
  const llama::ModelArgs back = llama::args_from_hf_config(scratch / "hf" / "config.json");
  EXPECT_EQ(back.ffn_hidden_dim(), args.ffn_hidden_dim());
  EXPECT_EQ(back.kv_heads(), args.kv_heads());
  EXPECT_EQ(back.n_layers, args.n_layers);

  import_hf(scratch / "hf", scratch / "imported" / "step-0");
  for (const auto& [fqn, w] : weights) {
    expect_bitwise(checkpoint::read_whole_tensor(scratch / "imported" / "step-0", "model." + fqn),
                   w, fqn);
  }
  // The HF q projection is really permuted (not a copy), and bf16 export casts.
  const checkpoint::NamedTensors hf = checkpoint::read_safetensors_folder(scratch / "hf");
  const Tensor q = hf.at("model.layers.0.self_attn.q_proj.weight");
  const Tensor ours_q = weights.at("layers.0.attention.wq.weight");
  EXPECT_NE(std::memcmp(q.data_ptr(), ours_q.contiguous().data_ptr(), q.nbytes()), 0);
  options.dtype = DType::BF16;
  export_hf(scratch / "ckpt" / "step-3", scratch / "hf16", options);
  EXPECT_EQ(checkpoint::read_safetensors_folder(scratch / "hf16").at("lm_head.weight").dtype(),
            DType::BF16);
}

// import-hf then export-hf (the architecture now from the config.json the import kept) writes
// the same files, byte for byte, tied embeddings included.
TEST(HfConversion, ImportedCheckpointExportsTheSameFiles) {
  testing::ScratchDir scratch;
  llama::ModelArgs args = small_args();
  args.tie_embeddings = true;
  save_model(scratch / "ckpt" / "step-1", args);
  HfExportOptions options;
  options.args = args;
  options.max_shard_bytes = 40'000;
  export_hf(scratch / "ckpt" / "step-1", scratch / "hf", options);
  import_hf(scratch / "hf", scratch / "imported" / "step-0");
  HfExportOptions again;
  again.max_shard_bytes = 40'000;
  export_hf(scratch / "imported" / "step-0", scratch / "hf2", again);
  int files = 0;
  for (const auto& e : fs::directory_iterator(scratch / "hf")) {
    const fs::path other = scratch / "hf2" / e.path().filename();
    ASSERT_TRUE(fs::exists(other)) << other;
    std::ifstream a(e.path(), std::ios::binary), b(other, std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}),
              std::string(std::istreambuf_iterator<char>(b), {}))
        << e.path().filename();
    ++files;
  }
  EXPECT_GE(files, 4);  // shards, index, config.json
  EXPECT_EQ(std::distance(fs::directory_iterator(scratch / "hf2"), fs::directory_iterator()),
            files);
}

// transformers' rotate_half RoPE on x [T, H, D]: out = x * cos + rotate_half(x) * sin with
// cos/sin of frequency i in both halves; written independently of runtime::apply_rope.
Tensor rotate_half_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), half = D / 2;
  Tensor out = runtime::Tensor::empty(x.shape(), {DType::F64});
  const Tensor c = cos.to(DType::F64).contiguous(), s = sin.to(DType::F64).contiguous();
  const Tensor xc = x.to(DType::F64).contiguous();
  const double* xp = xc.data<double>();
  double* op = out.data<double>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const double* v = xp + (t * H + h) * D;
      double* o = op + (t * H + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const double cs = c.data<double>()[t * half + i], sn = s.data<double>()[t * half + i];
        o[i] = v[i] * cs - v[i + half] * sn;
        o[i + half] = v[i + half] * cs + v[i] * sn;
      }
    }
  }
  return out;
}

TEST(HfConversion, PermutedProjectionsGiveTheSameAttentionScores) {
  const llama::ModelArgs a = small_args();
  const int64_t T = 5, D = a.head_dim();
  runtime::NoGradGuard no_grad;
  const Tensor wq = testing::randn_as({a.n_heads * D, a.dim}, DType::F64, 1);
  const Tensor wk = testing::randn_as({a.kv_heads() * D, a.dim}, DType::F64, 2);
  llama::Weights ours;
  models::ModelSpec spec = models::get_model_spec("llama3", "debugmodel");
  *spec.args = a;
  auto model = spec.build({.seed = 1});
  for (const auto& [fqn, p] : model->named_parameters()) ours[fqn] = p.detach();
  ours["layers.0.attention.wq.weight"] = wq.to(DType::F32);
  ours["layers.0.attention.wk.weight"] = wk.to(DType::F32);
  const llama::Weights hf = llama::to_hf(ours, a);
  const Tensor x = testing::randn_as({T, a.dim}, DType::F32, 3);
  const runtime::RopeTables rope = runtime::rope_frequencies(D, 32, a.rope_theta, a.rope_scaling);
  const Tensor cos = rope.cos.narrow(0, 0, T), sin = rope.sin.narrow(0, 0, T);
  auto project = [&](const Tensor& w, int64_t heads) {
    return runtime::matmul(x, w.transpose(0, 1)).reshape({T, heads, D});
  };
  // Ours: interleaved RoPE on our rows. HF: rotate_half RoPE on the permuted rows.
  const Tensor q1 = runtime::apply_rope(project(ours["layers.0.attention.wq.weight"], a.n_heads)
                                            .reshape({1, T, a.n_heads, D}),
                                        rope.cos, rope.sin)
                        .reshape({T, a.n_heads, D})
                        .to(DType::F64);
  const Tensor k1 = runtime::apply_rope(project(ours["layers.0.attention.wk.weight"], a.kv_heads())
                                            .reshape({1, T, a.kv_heads(), D}),
                                        rope.cos, rope.sin)
                        .reshape({T, a.kv_heads(), D})
                        .to(DType::F64);
  const Tensor q2 = rotate_half_rope(project(hf.at("model.layers.0.self_attn.q_proj.weight"), a.n_heads), cos, sin);
  const Tensor k2 = rotate_half_rope(project(hf.at("model.layers.0.self_attn.k_proj.weight"), a.kv_heads()), cos, sin);
  const int64_t group = a.n_heads / a.kv_heads();
  double worst = 0;
  for (int64_t h = 0; h < a.n_heads; ++h) {
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j < T; ++j) {
        double s1 = 0, s2 = 0;
        for (int64_t d = 0; d < D; ++d) {
          s1 += q1.data<double>()[(i * a.n_heads + h) * D + d] *
                k1.data<double>()[(j * a.kv_heads() + h / group) * D + d];
          s2 += q2.data<double>()[(i * a.n_heads + h) * D + d] *
                k2.data<double>()[(j * a.kv_heads() + h / group) * D + d];
        }
        worst = std::max(worst, std::abs(s1 - s2) / (1 + std::abs(s1)));
      }
    }
  }
  EXPECT_LT(worst, 1e-4) << "attention scores differ between the two RoPE layouts";
}

using mt::testing::error_of;

TEST(HfConversion, BadInputsAreErrorsNamingTheProblem) {
  testing::ScratchDir scratch;
  const llama::ModelArgs args = small_args();
  llama::Weights ours = save_model(scratch / "c" / "step-1", args);
  ours.erase("norm.weight");
  EXPECT_NE(error_of([&] { llama::to_hf(ours, args); }).find("tensor norm.weight is missing"),
            std::string::npos);
  llama::ModelArgs wrong = args;
  wrong.n_layers = 1;
  ours = save_model(scratch / "d" / "step-1", args);
  EXPECT_NE(error_of([&] { llama::to_hf(ours, wrong); }).find("unexpected tensor layers.1."),
            std::string::npos);
  // Truncated and garbage safetensors files.
  checkpoint::write_safetensors(scratch / "a.safetensors", {{"w", runtime::ones({4, 4}, {DType::F32})}});
  fs::resize_file(scratch / "a.safetensors", fs::file_size(scratch / "a.safetensors") - 8);
  EXPECT_NE(error_of([&] { checkpoint::read_safetensors(scratch / "a.safetensors"); })
                .find("tensor w: data_offsets [0, 64) lie outside"),
            std::string::npos);
  std::ofstream(scratch / "b.safetensors") << "not a safetensors file at all";
  EXPECT_NE(error_of([&] { checkpoint::read_safetensors(scratch / "b.safetensors"); })
                .find("header length"),
            std::string::npos);
  EXPECT_NE(error_of([&] { checkpoint::read_safetensors_folder(scratch / "c"); })
                .find("neither model.safetensors nor"),
            std::string::npos);
  std::ofstream(scratch / "config.json") << R"({"model_type": "mistral"})";
  EXPECT_NE(error_of([&] { llama::args_from_hf_config(scratch / "config.json"); })
                .find("model_type is not \"llama\""),
            std::string::npos);
}

// Nothing a user had is lost to a conversion: import-hf never writes over a folder that holds
// anything (a checkpoint save replaces its folder whole), and integer dtypes, which would truncate
// trained weights to zeros, are refused by every conversion.
TEST(HfConversion, ConversionsRefuseToOverwriteOrTruncate) {
  testing::ScratchDir scratch;
  const llama::ModelArgs args = small_args();
  save_model(scratch / "ckpt" / "step-3", args);
  HfExportOptions options;
  options.args = args;
  export_hf(scratch / "ckpt" / "step-3", scratch / "hf", options);
  fs::create_directories(scratch / "mine");
  std::ofstream(scratch / "mine" / "notes.txt") << "keep";
  EXPECT_NE(error_of([&] { import_hf(scratch / "hf", scratch / "mine"); })
                .find("already exists; name a new folder (nothing was written)"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(scratch / "mine" / "notes.txt"));
  EXPECT_NE(error_of([&] { import_hf(scratch / "hf", scratch / "ckpt"); }).find("already exists"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(scratch / "ckpt" / "step-3" / "index.h5"));
  fs::create_directories(scratch / "empty");
  import_hf(scratch / "hf", scratch / "empty");  // an empty folder is a new one
  EXPECT_TRUE(fs::exists(scratch / "empty" / "index.h5"));

  for (DType integer : {DType::I32, DType::I64, DType::Bool}) {
    SCOPED_TRACE(runtime::dtype_name(integer));
    EXPECT_NE(error_of([&] { import_hf(scratch / "hf", scratch / "int", integer); })
                  .find("is not a floating dtype"),
              std::string::npos);
    HfExportOptions as_integer = options;
    as_integer.dtype = integer;
    EXPECT_NE(error_of([&] { export_hf(scratch / "ckpt" / "step-3", scratch / "hf_int",
                                       as_integer); })
                  .find("is not a floating dtype"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                checkpoint::consolidate_checkpoint(scratch / "ckpt" / "step-3",
                                                   scratch / "int.h5", integer);
              }).find("is not a floating dtype"),
              std::string::npos);
  }
  EXPECT_FALSE(fs::exists(scratch / "int") || fs::exists(scratch / "hf_int") ||
               fs::exists(scratch / "int.h5"));
}

TEST(HfConversion, PythonSafetensorsReadsOurFiles) {
  const auto python = testing::python_with("safetensors");
  if (!python) GTEST_SKIP() << "no Python with safetensors (pip install safetensors numpy)";
  testing::ScratchDir scratch;
  checkpoint::write_safetensors(
      scratch / "t.safetensors",
      {{"f", runtime::arange(0, 6, 1, {DType::F32}).reshape({2, 3})},
       {"b", runtime::arange(0, 4, 0.5, {DType::BF16})},
       {"i", runtime::arange(0, 3, 1, {DType::I64})}});
  const std::string script =
      "import sys, numpy as np\n"
      "from safetensors import safe_open\n"
      "with safe_open(sys.argv[1], 'np') as f:\n"
      "    assert sorted(f.keys()) == ['b', 'f', 'i'], f.keys()\n"
      "    assert f.get_tensor('f').tolist() == [[0, 1, 2], [3, 4, 5]]\n"
      "    assert f.get_tensor('i').tolist() == [0, 1, 2]\n"
      "    assert f.metadata() == {'format': 'pt'}\n"
      "print('safetensors ok')\n";
  std::ofstream(scratch / "check.py") << script;
  const testing::CommandResult r = testing::run_command(
      *python + " " + (scratch / "check.py").string() + " " + (scratch / "t.safetensors").string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("safetensors ok"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mt::train
