// mt_generate: samples text from a Llama model with a KV cache (models/llama/generate.h).
//
//   mt_generate --tokenizer TOKENIZER_JSON_OR_DIR --prompt "Once upon a time"
//               [--max-new-tokens 64] [--temperature 0 (greedy)] [--top-k 0 (all)] [--seed 0]
//               [--flavor debugmodel] [--max-seq-len N] [--init-seed 0] [--no-bos]
//               [--checkpoint STEP_DIR]
//
// The prompt is encoded with the tokenizer (BOS prepended when the tokenizer has one, unless
// --no-bos); the model's vocab_size is the tokenizer's. stdout gets the prompt followed by the
// generated text (a final EOS token is not printed); stderr gets the token counts, why it stopped
// and the speed.
//
// --checkpoint loads the model.* weights of a training checkpoint (a step-N folder, or the
// folder of them: the latest); --flavor must be the trained model's (a shape mismatch names the
// tensor). Without it the model is freshly initialised (from --init-seed) and stderr says so.
#include "models/llama/generate.h"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/manager.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "models/llama/model.h"
#include "models/llama/model_args.h"
#include "models/registry.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "tools/flags.h"

using mt::tools::FlagReader;

namespace {

namespace llama = mt::models::llama;

struct Args {
  std::string tokenizer;
  std::optional<std::string> prompt;
  std::string flavor = "debugmodel";
  std::optional<int64_t> max_seq_len;
  uint64_t init_seed = 0;
  std::string checkpoint;
  bool add_bos = true;
  llama::GenerateOptions gen;
};

void usage(std::ostream& os) {
  os << "usage: mt_generate --tokenizer TOKENIZER_JSON_OR_DIR --prompt TEXT\n"
        "         [--max-new-tokens N (64)] [--temperature T (0: greedy)] [--top-k K (0: all)]\n"
        "         [--seed S (0)] [--flavor debugmodel] [--max-seq-len N] [--init-seed S (0)]\n"
        "         [--no-bos]\n"
        "         [--checkpoint STEP_DIR (trained weights; else a fresh model from --init-seed)]\n";
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
    } else if (arg == "--flavor") {
      a.flavor = flags.value();
    } else if (arg == "--max-seq-len") {
      a.max_seq_len = flags.int_value();
    } else if (arg == "--no-bos") {
      a.add_bos = false;
    } else if (arg == "--checkpoint") {
      a.checkpoint = flags.value();
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

// The model.* tensors of a training checkpoint into `model` (any float dtype converted).
void load_weights(mt::runtime::nn::Module& model, const std::string& path) {
  namespace ckpt = mt::checkpoint;
  const auto dir = ckpt::resolve_checkpoint_dir(path, "mt_generate --checkpoint");
  ckpt::CheckpointState dest;
  for (const auto& [fqn, param] : model.named_parameters()) {
    dest.tensors.push_back(ckpt::whole("model." + fqn, param.detach()));
  }
  ckpt::LoadOptions options;
  options.exclude = {"optimizer.", "lr_scheduler."};
  options.convert_dtypes = true;
  auto world = mt::parallel::MpiProcessGroup::world();
  mt::runtime::NoGradGuard no_grad;
  ckpt::load_checkpoint(dir, dest, *world, options);
  std::cerr << "mt_generate: loaded the weights of " << dir.string() << "\n";
}

int run(const Args& a) {
  const auto tokenizer = mt::data::BpeTokenizer::from_file(a.tokenizer);
  std::vector<int32_t> ids = tokenizer.encode(*a.prompt, a.add_bos && tokenizer.bos_id());
  MT_CHECK(!ids.empty(),
           "mt_generate: the prompt encodes to no tokens (an empty prompt needs a "
           "tokenizer with a BOS token)");
  const std::vector<int64_t> prompt(ids.begin(), ids.end());

  mt::models::ModelSpec spec = mt::models::get_model_spec("llama3", a.flavor);
  auto& margs = std::any_cast<llama::ModelArgs&>(*spec.args);
  margs.vocab_size = tokenizer.vocab_size();
  if (a.max_seq_len) margs.max_seq_len = *a.max_seq_len;
  MT_CHECK(int64_t(prompt.size()) <= margs.max_seq_len, "mt_generate: the prompt is ",
           prompt.size(), " tokens, longer than max_seq_len = ", margs.max_seq_len,
           " (--max-seq-len)");
  auto module = spec.build({.seed = a.init_seed});
  if (a.checkpoint.empty()) {
    std::cerr << "mt_generate: WARNING: no --checkpoint: sampling from a freshly initialised llama3 "
              << a.flavor << " (init seed " << a.init_seed << "), the output is noise\n";
  } else {
    load_weights(*module, a.checkpoint);
  }
  auto* model = dynamic_cast<llama::Transformer*>(module.get());
  MT_CHECK(model != nullptr, "mt_generate: the llama3 spec did not build a llama Transformer");

  llama::GenerateOptions gen = a.gen;
  if (const auto eos = tokenizer.eos_id()) gen.eos_id = *eos;
  const auto start = std::chrono::steady_clock::now();
  const llama::GenerateResult r = llama::generate(*model, prompt, gen);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<int32_t> out(r.tokens.begin(), r.tokens.end());
  if (r.stop_reason == llama::StopReason::Eos && !out.empty()) out.pop_back();
  std::cout << *a.prompt << tokenizer.decode(out) << std::endl;
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
