// mt_generate: samples text from a Llama (or DeepSeek-V3-style MoE) model with a KV cache
// (models/decode.h).
//
//   mt_generate --tokenizer TOKENIZER_JSON_OR_DIR --prompt "Once upon a time"
//               [--checkpoint STEP_DIR] [--max-new-tokens 64] [--temperature 0 (greedy)]
//               [--top-k 0 (all)] [--seed 0] [--model llama3|deepseek_v3] [--flavor F]
//               [--max-seq-len N] [--init-seed 0] [--no-bos] [--json]
//               [--logits-out FILE.safetensors]
//
// The prompt is encoded with the tokenizer (BOS prepended when the tokenizer has one, unless
// --no-bos). stdout gets the prompt followed by the generated text (a final EOS token is not
// printed), or with --json one JSON object {"prompt_ids", "generated_ids" (a final EOS
// included), "stop_reason", "text"} for machines; stderr gets the token counts, why it stopped
// and the speed. --logits-out writes the f32 logits of the prompt's forward pass ("logits",
// [prompt tokens, vocab]) as safetensors.
//
// --checkpoint loads the model.* weights of a training or imported checkpoint (a step-N folder,
// or the folder of them: the latest). The model is the checkpoint's saved architecture (any
// Llama 3 shape; vocab as saved, which must hold the tokenizer's ids); a --flavor given as well
// must agree with it in every field (else an error lists the differences). Checkpoints saved
// before the architecture was kept need --flavor (debugmodel by default; vocab = the
// tokenizer's), whose shapes are compared with the checkpoint's before anything is allocated.
// Without --checkpoint the model is a fresh --flavor (from --init-seed) and stderr says so.
// --model deepseek_v3 (a MoE training run's checkpoint, which keeps no architecture) takes its
// --flavor (moe_debug by default) with the tokenizer's vocab, its shapes compared with the
// checkpoint's the same way.
// The KV cache and RoPE tables cover --max-seq-len positions (default: prompt + new tokens, at
// most the model's max_position_embeddings).
#include "models/decode.h"
#include "models/llama/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/index.h"
#include "checkpoint/manager.h"
#include "checkpoint/safetensors.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "models/llama/model.h"
#include "models/llama/model_args.h"
#include "models/registry.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/nn/init.h"
#include "runtime/ops/factory.h"
#include "tools/flags.h"
#include "train/checkpointer.h"
#include "train/model_spec.h"

using mt::tools::FlagReader;

namespace {

namespace fs = std::filesystem;
namespace llama = mt::models::llama;
namespace ckpt = mt::checkpoint;

struct Args {
  std::string tokenizer;
  std::optional<std::string> prompt;
  std::string model = "llama3";       // or deepseek_v3
  std::optional<std::string> flavor;  // unset: the checkpoint's architecture (else the default)
  std::optional<int64_t> max_seq_len;
  uint64_t init_seed = 0;
  std::string checkpoint;
  bool add_bos = true;
  bool json = false;
  std::string logits_out;
  llama::GenerateOptions gen;
};

void usage(std::ostream& os) {
  os << "usage: mt_generate --tokenizer TOKENIZER_JSON_OR_DIR --prompt TEXT\n"
        "         [--checkpoint STEP_DIR (trained weights and architecture; else a fresh model)]\n"
        "         [--max-new-tokens N (64)] [--temperature T (0: greedy)] [--top-k K (0: all)]\n"
        "         [--seed S (0)] [--model llama3|deepseek_v3 (llama3)]\n"
        "         [--flavor F (the checkpoint's architecture, else debugmodel / moe_debug)]\n"
        "         [--max-seq-len N (prompt + new tokens)] [--init-seed S (0)] [--no-bos]\n"
        "         [--json (ids and text as one JSON object)] [--logits-out FILE.safetensors]\n";
}

Args parse_args(int argc, char** argv) {
  Args a;
  FlagReader flags("mt_generate", argc, argv);
  while (flags.next()) {
    const std::string& arg = flags.arg();
    if (arg == "--help" || arg == "-h") {
      usage(std::cout);
      std::exit(0);
    } else if (arg == "--tokenizer") {
      a.tokenizer = flags.value();
    } else if (arg == "--prompt") {
      a.prompt = flags.value();
    } else if (arg == "--max-new-tokens") {
      a.gen.max_new_tokens = flags.int_value();
    } else if (arg == "--temperature") {
      a.gen.temperature = flags.double_value();
    } else if (arg == "--top-k") {
      a.gen.top_k = flags.int_value();
    } else if (arg == "--seed") {
      const int64_t s = flags.int_value();
      MT_CHECK(s >= 0, "mt_generate: --seed expects a non-negative integer, got ", s);
      a.gen.seed = uint64_t(s);
    } else if (arg == "--init-seed") {
      const int64_t s = flags.int_value();
      MT_CHECK(s >= 0, "mt_generate: --init-seed expects a non-negative integer, got ", s);
      a.init_seed = uint64_t(s);
    } else if (arg == "--model") {
      a.model = flags.value();
      MT_CHECK(a.model == "llama3" || a.model == "deepseek_v3",
               "mt_generate: --model expects llama3 or deepseek_v3, got '", a.model, "'");
    } else if (arg == "--flavor") {
      a.flavor = flags.value();
    } else if (arg == "--max-seq-len") {
      a.max_seq_len = flags.int_value();
      MT_CHECK(*a.max_seq_len > 0, "mt_generate: --max-seq-len expects a positive integer, got ",
               *a.max_seq_len);
    } else if (arg == "--no-bos") {
      a.add_bos = false;
    } else if (arg == "--checkpoint") {
      a.checkpoint = flags.value();
    } else if (arg == "--json") {
      a.json = true;
    } else if (arg == "--logits-out") {
      a.logits_out = flags.value();
    } else {
      usage(std::cerr);
      MT_FAIL("mt_generate: unknown argument '", arg, "'");
    }
  }
  MT_CHECK(!a.tokenizer.empty(), "mt_generate: --tokenizer is required");
  MT_CHECK(a.prompt.has_value(), "mt_generate: --prompt is required");
  llama::validate(a.gen);  // temperature >= 0, top_k >= 0, max_new_tokens >= 0
  return a;
}

// Every parameter of the spec's model against the checkpoint's tensors, by shape, on a model
// built without values (nothing allocated): a flavor that is not the checkpoint's is an error
// before a large model is built.
void check_shapes(const mt::models::ModelSpec& spec, const ckpt::Index& index,
                  const fs::path& dir) {
  std::shared_ptr<mt::runtime::nn::Module> shell;
  {
    mt::runtime::nn::DeferredInitGuard no_values;
    shell = spec.build({});
  }
  std::string differences;
  for (const auto& [fqn, param] : shell->named_parameters()) {
    const std::string name = "model." + fqn;
    const ckpt::IndexChunk* saved = nullptr;
    for (const ckpt::IndexChunk& c : index.chunks) {
      if (c.meta.fqn == name) saved = &c;
    }
    if (saved == nullptr) {
      differences += "\n  " + name + ": not in the checkpoint";
    } else if (saved->meta.global_shape != param.shape()) {
      differences += mt::detail::concat("\n  ", name, ": ", saved->meta.global_shape,
                                        " in the checkpoint, ", param.shape(), " in the model");
    }
  }
  MT_CHECK(differences.empty(), "mt_generate: --flavor ", spec.flavor,
           " is not the model saved in ", dir.string(), ":", differences);
}

// The model to build: the checkpoint's architecture, or --flavor checked against it.
mt::models::ModelSpec model_spec(const Args& a, const mt::data::BpeTokenizer& tokenizer,
                                 const fs::path& dir, int64_t tokens_needed) {
  std::optional<ckpt::Index> index;
  std::optional<mt::train::SavedArchitecture> saved;
  if (!dir.empty()) {
    index = ckpt::read_index(dir / ckpt::kIndexFileName);
    saved = mt::train::saved_architecture(index->values, dir);
  }
  MT_CHECK(!saved || a.model == "llama3", "mt_generate: ", dir.string(),
           " saved a llama3 architecture, not a ", a.model, " one (--model)");
  mt::models::ModelSpec spec;
  if (saved && !a.flavor) {
    spec = mt::models::model_spec_from_architecture("llama3", saved->text, saved->where);
  } else {
    spec = mt::models::get_model_spec(
        a.model, a.flavor.value_or(a.model == "llama3" ? "debugmodel" : "moe_debug"));
    mt::train::with_lm_args(spec, [&](auto& args) { args.vocab_size = tokenizer.vocab_size(); });
    if (saved) {
      spec = mt::train::adopt_saved_architecture(
          spec, *saved,
          "--flavor " + *a.flavor + " with the tokenizer's vocab (" +
              std::to_string(tokenizer.vocab_size()) + ")");
    }
  }
  mt::train::with_lm_args(spec, [&](auto& args) {
    MT_CHECK(tokenizer.vocab_size() <= args.vocab_size, "mt_generate: the tokenizer ",
             a.tokenizer, " has ", tokenizer.vocab_size(),
             " tokens, more than the model's vocab_size ", args.vocab_size);
    int64_t longest = tokens_needed;
    if constexpr (requires { args.max_position_embeddings; }) {
      longest = std::min(longest, args.max_position_embeddings);
      MT_CHECK(a.max_seq_len.value_or(0) <= args.max_position_embeddings,
               "mt_generate: --max-seq-len ", a.max_seq_len.value_or(0),
               " is more than the model's max_position_embeddings, ",
               args.max_position_embeddings);
    }
    args.max_seq_len = a.max_seq_len.value_or(longest);
  });
  if (index && !saved) check_shapes(spec, *index, dir);
  return spec;
}

// The model.* tensors of a checkpoint (parameters and persistent buffers) into `model` (any float
// dtype converted).
void load_weights(mt::runtime::nn::Module& model, const fs::path& dir) {
  ckpt::CheckpointState dest;
  for (const auto& [fqn, param] : model.named_parameters()) {
    dest.tensors.push_back(ckpt::whole("model." + fqn, param.detach()));
  }
  for (const auto& [fqn, buffer] : mt::train::persistent_buffers(model)) {  // e.g. MoE routing bias
    dest.tensors.push_back(ckpt::whole("model." + fqn, buffer.detach()));
  }
  ckpt::LoadOptions options;
  options.exclude = {"optimizer.", "lr_scheduler."};
  options.convert_dtypes = true;
  auto world = mt::parallel::MpiProcessGroup::world();
  mt::runtime::NoGradGuard no_grad;
  ckpt::load_checkpoint(dir, dest, *world, options);
  std::cerr << "mt_generate: loaded the weights of " << dir.string() << "\n";
}

void write_prompt_logits(const mt::models::ModelSpec& spec, mt::runtime::nn::Module& model,
                         const std::vector<int64_t>& prompt, const std::string& path) {
  mt::runtime::NoGradGuard no_grad;
  const int64_t n = int64_t(prompt.size());
  const mt::runtime::Tensor tokens =
      mt::runtime::from_vector<int64_t>(prompt, {1, n}, {mt::runtime::DType::I64});
  const mt::runtime::Tensor logits = spec.forward(model, tokens).to(mt::runtime::DType::F32);
  ckpt::write_safetensors(path, {{"logits", logits.reshape({n, logits.size(2)}).contiguous()}});
  std::cerr << "mt_generate: wrote the prompt's logits to " << path << "\n";
}

int run(const Args& a) {
  const auto tokenizer = mt::data::BpeTokenizer::from_file(a.tokenizer);
  std::vector<int32_t> ids = tokenizer.encode(*a.prompt, a.add_bos && tokenizer.bos_id());
  MT_CHECK(!ids.empty(),
           "mt_generate: the prompt encodes to no tokens (an empty prompt needs a "
           "tokenizer with a BOS token)");
  const std::vector<int64_t> prompt(ids.begin(), ids.end());

  const fs::path dir = a.checkpoint.empty() ? fs::path()
                                            : ckpt::resolve_checkpoint_dir(
                                                  a.checkpoint, "mt_generate --checkpoint");
  mt::models::ModelSpec spec =
      model_spec(a, tokenizer, dir, int64_t(prompt.size()) + a.gen.max_new_tokens);
  // The tokenizer's ids: a model with a padded vocab never samples the others.
  const llama::DecodeLimits limits{tokenizer.vocab_size(), *mt::train::max_seq_len_of(spec)};
  MT_CHECK(int64_t(prompt.size()) <= limits.max_seq_len, "mt_generate: the prompt is ",
           prompt.size(), " tokens, longer than max_seq_len = ", limits.max_seq_len,
           " (--max-seq-len; at most the model's max_position_embeddings)");
  auto module = spec.build({.seed = a.init_seed});
  if (dir.empty()) {
    std::cerr << "mt_generate: WARNING: no --checkpoint: sampling from a freshly initialised "
              << a.model << " " << spec.flavor << " (init seed " << a.init_seed
              << "), the output is noise\n";
  } else {
    load_weights(*module, dir);
  }
  if (!a.logits_out.empty()) write_prompt_logits(spec, *module, prompt, a.logits_out);

  llama::GenerateOptions gen = a.gen;
  if (const auto eos = tokenizer.eos_id()) gen.eos_id = *eos;
  const auto start = std::chrono::steady_clock::now();
  const llama::GenerateResult r = mt::models::generate(spec, *module, limits, prompt, gen);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<int32_t> out(r.tokens.begin(), r.tokens.end());
  if (r.stop_reason == llama::StopReason::Eos && !out.empty()) out.pop_back();
  const std::string text = tokenizer.decode_model_output(out);
  if (a.json) {
    const nlohmann::json j = {{"prompt_ids", prompt},
                              {"generated_ids", r.tokens},
                              {"stop_reason", llama::stop_reason_name(r.stop_reason)},
                              {"text", text}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  } else {
    std::cout << *a.prompt << text << std::endl;
  }
  std::cerr << "mt_generate: prompt " << prompt.size() << " tokens, generated " << r.tokens.size()
            << " tokens, stopped at " << llama::stop_reason_name(r.stop_reason) << ", " << seconds
            << " s (" << (seconds > 0 ? double(r.tokens.size()) / seconds : 0.0) << " tokens/s)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
