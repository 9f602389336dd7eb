// mt_demo_train: trains a tiny character-level language model with the runtime, to show the
// whole stack (modules, autograd, fused cross-entropy, AdamW, warmup + cosine schedule) at work
// until the `train` binary exists.
//
// Model: the previous 8 characters -> Embedding(V, 16) -> flatten [128] -> Linear(128, 256) ->
// RMSNorm -> ReLU -> Linear(256, V) -> next-character logits. Data: Tiny Shakespeare from the
// shared data folder (--data, $MT_SHARED_DATA or ../shared/data, as the tests look for it);
// without it, a synthetic text from a fixed noisy recurrence drawn from the counter-based RNG.
// Batches are drawn from RandomKey(seed, "batch", step), so a run is reproducible for any
// --threads. Prints step, training loss, lr, tokens/s and memory every --log-every steps, and a
// held-out loss at the start and the end.
//
//   mt_demo_train [--steps 200] [--seed 0] [--threads N] [--batch 256] [--lr 3e-3]
//                 [--log-every 20] [--data PATH]
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/core/grad_mode.h"
#include "runtime/core/rng.h"
#include "runtime/nn/embedding.h"
#include "runtime/nn/linear.h"
#include "runtime/nn/module.h"
#include "runtime/nn/rms_norm.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/lr_scheduler.h"

namespace {

using namespace mt::runtime;

constexpr int64_t kContext = 8, kEmbed = 16, kHidden = 256;

struct Flags {
  int64_t steps = 200;
  uint64_t seed = 0;
  int threads = 0;  // 0: OpenMP's default
  int64_t batch = 256;
  double lr = 3e-3;
  int64_t log_every = 20;
  std::string data;
};

void usage(std::ostream& os) {
  os << "usage: mt_demo_train [--steps N] [--seed S] [--threads T] [--batch B] [--lr LR]\n"
        "                     [--log-every N] [--data PATH]\n";
}

[[noreturn]] void fail_usage(const std::string& msg) {
  std::cerr << "mt_demo_train: " << msg << "\n";
  usage(std::cerr);
  std::exit(2);
}

template <class T>
T parse_number(const std::string& flag, const std::string& text) {
  std::istringstream is(text);
  T value{};
  is >> value;
  if (!is || !is.eof()) fail_usage(flag + " expects a number, got '" + text + "'");
  return value;
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      usage(std::cout);
      std::exit(0);
    }
    if (i + 1 >= argc) fail_usage("missing value after " + flag);
    const std::string value = argv[++i];
    if (flag == "--steps") {
      f.steps = parse_number<int64_t>(flag, value);
    } else if (flag == "--seed") {
      f.seed = parse_number<uint64_t>(flag, value);
    } else if (flag == "--threads") {
      f.threads = parse_number<int>(flag, value);
    } else if (flag == "--batch") {
      f.batch = parse_number<int64_t>(flag, value);
    } else if (flag == "--lr") {
      f.lr = parse_number<double>(flag, value);
    } else if (flag == "--log-every") {
      f.log_every = parse_number<int64_t>(flag, value);
    } else if (flag == "--data") {
      f.data = value;
    } else {
      fail_usage("unknown flag '" + flag + "'");
    }
  }
  if (f.steps <= 0) fail_usage("--steps must be > 0");
  if (f.threads < 0) fail_usage("--threads must be >= 0");
  if (f.batch <= 0) fail_usage("--batch must be > 0");
  if (!(f.lr > 0)) fail_usage("--lr must be > 0");
  if (f.log_every <= 0) fail_usage("--log-every must be > 0");
  return f;
}

struct Corpus {
  std::vector<int64_t> tokens;
  int64_t vocab = 0;
  std::string source;
};

std::string find_shakespeare(const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("MT_SHARED_DATA")) dirs.emplace_back(env);
  for (const char* d : {"../shared/data", "../../shared/data", "../../../shared/data"})
    dirs.emplace_back(d);
  for (const std::string& d : dirs) {
    const std::string p = d + "/tinyshakespeare.txt";
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

Corpus load_corpus(const Flags& flags) {
  Corpus c;
  const std::string path = find_shakespeare(flags.data);
  if (!path.empty()) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::cerr << "mt_demo_train: cannot open " << path << "\n";
      std::exit(1);
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (int64_t(text.size()) < 10 * (kContext + 1)) {
      std::cerr << "mt_demo_train: " << path << " is too short (" << text.size() << " bytes)\n";
      std::exit(1);
    }
    std::array<int64_t, 256> id;
    id.fill(-1);
    for (unsigned char ch : text) id[ch] = 0;
    for (int b = 0; b < 256; ++b)
      if (id[b] == 0) id[b] = c.vocab++;
    c.tokens.reserve(text.size());
    for (unsigned char ch : text) c.tokens.push_back(id[ch]);
    c.source = path;
    return c;
  }
  // Synthetic: t_i = (7 t_{i-1} + 3) mod V (a fixed permutation: learnable from the last
  // character), with 10% of the tokens replaced by noise (so the loss floor is about 0.7).
  c.vocab = 32;
  const RandomKey key(flags.seed, "demo_train.synthetic");
  c.tokens = {1, 2};
  for (int64_t i = 2; i < 200000; ++i) {
    int64_t t = (7 * c.tokens[i - 1] + 3) % c.vocab;
    const auto r = philox(key, uint64_t(i));
    if (r[0] % 10 == 0) t = r[1] % uint32_t(c.vocab);
    c.tokens.push_back(t);
  }
  c.source = "synthetic (no tinyshakespeare.txt found; pass --data or set MT_SHARED_DATA)";
  return c;
}

class CharMlp : public nn::Module {
 public:
  explicit CharMlp(int64_t vocab) : Module("CharMlp") {
    tok = register_module("tok_embeddings", std::make_shared<nn::Embedding>(vocab, kEmbed));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kContext * kEmbed, kHidden));
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(kHidden));
    fc2 = register_module("output", std::make_shared<nn::Linear>(kHidden, vocab));
  }
  // ids [B, kContext] -> logits [B, V]
  Tensor operator()(const Tensor& ids) {
    return call({ids}, [this](const std::vector<Tensor>& in) {
      const Tensor e = (*tok)(in[0]).reshape({in[0].size(0), kContext * kEmbed});
      return (*fc2)(relu((*norm)((*fc1)(e))));
    });
  }
  std::shared_ptr<nn::Embedding> tok;
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::RMSNorm> norm;
};

struct Batch {
  Tensor ids, targets;
};

// Examples start at uniformly drawn positions of tokens[begin, end).
Batch make_batch(const std::vector<int64_t>& tokens, int64_t begin, int64_t end, int64_t batch,
                 const RandomKey& key) {
  std::vector<int64_t> ids(static_cast<size_t>(batch * kContext));
  std::vector<int64_t> targets(static_cast<size_t>(batch));
  const int64_t span = end - begin - kContext;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = begin + std::min(span - 1, int64_t(uniform_at(key, uint64_t(b)) * span));
    for (int64_t j = 0; j < kContext; ++j)
      ids[size_t(b * kContext + j)] = tokens[size_t(start + j)];
    targets[size_t(b)] = tokens[size_t(start + kContext)];
  }
  const TensorOptions i64 = TensorOptions{}.with_dtype(DType::I64);
  return {from_vector(ids, {batch, kContext}, i64), from_vector(targets, {batch}, i64)};
}

double mib(int64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

int run(const Flags& flags) {
  if (flags.threads > 0) omp_set_num_threads(flags.threads);
  const Corpus corpus = load_corpus(flags);
  const int64_t n = int64_t(corpus.tokens.size());
  const int64_t split = n - std::max<int64_t>(n / 10, 2 * (kContext + 1));  // last 10%: held out

  CharMlp model(corpus.vocab);
  model.init_weights(flags.seed);
  int64_t num_params = 0;
  for (const Tensor& p : model.parameters()) num_params += p.numel();
  optim::AdamW opt(model.named_parameters(), optim::AdamWOptions{flags.lr, 0.9, 0.95, 1e-8, 0.01});
  const int64_t warmup = std::max<int64_t>(1, flags.steps / 10);
  optim::LRScheduler sched(
      opt, flags.steps,
      optim::WarmupStableDecay{warmup, std::nullopt, optim::DecayType::Cosine, 0.1});

  std::printf("data: %s (%lld tokens, vocab %lld)\n", corpus.source.c_str(), (long long)n,
              (long long)corpus.vocab);
  std::printf(
      "model: %lld parameters; AdamW lr %.2e, %lld warmup steps then cosine to 0.1x; "
      "batch %lld; %d threads\n",
      (long long)num_params, flags.lr, (long long)warmup, (long long)flags.batch,
      omp_get_max_threads());

  const Batch val = make_batch(corpus.tokens, split, n, 1024, RandomKey(flags.seed, "val"));
  auto val_loss = [&] {
    NoGradGuard no_grad;
    return cross_entropy(model(val.ids), val.targets).item<double>();
  };
  const double val_start = val_loss();

  std::printf("%6s %10s %10s %12s %12s %12s\n", "step", "loss", "lr", "tok/s", "mem MiB",
              "peak MiB");
  double first_loss = 0, last_loss = 0, window_seconds = 0;
  int64_t window_tokens = 0;
  for (int64_t step = 1; step <= flags.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const Batch b = make_batch(corpus.tokens, 0, split, flags.batch,
                               RandomKey(flags.seed, "batch", uint64_t(step)));
    const double lr = opt.lr();
    const Tensor loss = cross_entropy(model(b.ids), b.targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    sched.step();
    const double loss_value = loss.item<double>();
    window_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    window_tokens += flags.batch;
    if (step == 1) first_loss = loss_value;
    last_loss = loss_value;
    if (step == 1 || step % flags.log_every == 0 || step == flags.steps) {
      const MemoryStats mem = memory_stats(Device::cpu());
      std::printf("%6lld %10.4f %10.2e %12.0f %12.2f %12.2f\n", (long long)step, loss_value, lr,
                  double(window_tokens) / std::max(window_seconds, 1e-9), mib(mem.bytes_in_use),
                  mib(mem.peak_bytes_in_use));
      std::fflush(stdout);
      window_seconds = 0;
      window_tokens = 0;
    }
  }
  const double val_end = val_loss();
  std::printf("train loss %.4f -> %.4f; held-out loss %.4f -> %.4f\n", first_loss, last_loss,
              val_start, val_end);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  try {
    return run(flags);
  } catch (const mt::Error& e) {
    std::cerr << "mt_demo_train: " << e.what() << "\n";
    return 1;
  }
}
