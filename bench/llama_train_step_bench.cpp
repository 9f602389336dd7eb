// Tokens/s of one Llama training step on the CPU (forward, token cross-entropy, backward, AdamW),
// for the side-by-side comparison with PyTorch in bench/compare_train_step.sh (its peer is
// bench/llama_train_step_torch.py). Prints one line of `key=value` fields (parsed by that script).
//
//   llama_train_step_bench --model debugmodel|20M|88M --batch 8 --seq 256 --steps 10 --warmup 3
//   llama_train_step_bench --dim 512 --layers 8 --heads 8 --kv-heads 2 --dtype bf16
//
// --model is a shorthand for the shape (debugmodel: dim 256, 6 layers, 16/16 heads; 20M: 384, 10,
// 6/6; 88M: 768, 12, 12/12); --dim/--layers/--heads/--kv-heads override its fields. The rest is
// llama3's debugmodel: vocab 2000 (--vocab), multiple_of 256, untied output. --dtype bf16 builds
// bf16 parameters (models::BuildOptions::dtype; AdamW keeps f32 state).
//
// Memory: peak_mib is the CPU allocator's peak bytes in use; peak_rss_mib is getrusage's
// ru_maxrss over the whole process; step_peak_rss_mib the same after resetting the high-water mark
// (/proc/self/clear_refs "5", Linux) at the end of the warm-up: the peak of the timed steps.
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "models/llama/model_args.h"
#include "models/registry.h"
#include "runtime/core/allocator.h"
#include "runtime/core/profiler.h"
#include "runtime/ops/factory.h"
#include "runtime/optim/adamw.h"

using namespace mt;
using runtime::Tensor;

namespace {

struct Options {
  std::string model = "debugmodel";
  int64_t dim = 0, layers = 0, heads = 0, kv_heads = 0;  // 0: the --model shorthand's
  int64_t batch = 8, seq = 256, steps = 10, warmup = 3, vocab = 2000;
  std::string dtype = "f32";
  bool profile = false;  // prints the op profile of the last step
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "missing value after %s\n", flag.c_str());
      std::exit(2);
    }
    const char* value = argv[++i];
    if (flag == "--model") o.model = value;
    else if (flag == "--dim") o.dim = std::atoll(value);
    else if (flag == "--layers") o.layers = std::atoll(value);
    else if (flag == "--heads") o.heads = std::atoll(value);
    else if (flag == "--kv-heads") o.kv_heads = std::atoll(value);
    else if (flag == "--batch") o.batch = std::atoll(value);
    else if (flag == "--seq") o.seq = std::atoll(value);
    else if (flag == "--steps") o.steps = std::atoll(value);
    else if (flag == "--warmup") o.warmup = std::atoll(value);
    else if (flag == "--vocab") o.vocab = std::atoll(value);
    else if (flag == "--dtype") o.dtype = value;
    else if (flag == "--profile") o.profile = std::atoi(value) != 0;
    else {
      std::fprintf(stderr,
                   "unknown flag %s (valid: --model debugmodel|20M|88M --dim --layers --heads "
                   "--kv-heads --batch --seq --steps --warmup --vocab --dtype f32|bf16 "
                   "--profile 0|1)\n",
                   flag.c_str());
      std::exit(2);
    }
  }
  if (o.model != "debugmodel" && o.model != "20M" && o.model != "88M") {
    std::fprintf(stderr, "--model must be debugmodel, 20M or 88M, got %s\n", o.model.c_str());
    std::exit(2);
  }
  if (o.dtype != "f32" && o.dtype != "bf16") {
    std::fprintf(stderr, "--dtype must be f32 or bf16, got %s\n", o.dtype.c_str());
    std::exit(2);
  }
  if (o.batch < 1 || o.seq < 1 || o.steps < 1 || o.warmup < 0 || o.vocab < 1) {
    std::fprintf(stderr, "--batch, --seq, --steps and --vocab must be >= 1, --warmup >= 0\n");
    std::exit(2);
  }
  return o;
}

// Linux: restarts the process's RSS high-water mark (and so ru_maxrss) from the current RSS.
bool reset_peak_rss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

double peak_rss_mib() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;  // Linux: KiB
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  models::ModelSpec spec = models::get_model_spec("llama3", "debugmodel");
  auto& args = std::any_cast<models::llama::ModelArgs&>(*spec.args);
  args.vocab_size = o.vocab;
  args.max_seq_len = o.seq;
  if (o.model == "20M") {  // ~19M parameters with vocab 2000
    args.dim = 384;
    args.n_layers = 10;
    args.n_heads = 6;
    args.n_kv_heads = 6;
  } else if (o.model == "88M") {  // ~88M parameters with vocab 2000 (GPT-2 small's body)
    args.dim = 768;
    args.n_layers = 12;
    args.n_heads = 12;
    args.n_kv_heads = 12;
  }
  const models::llama::ModelArgs shorthand = args;
  if (o.dim > 0) args.dim = o.dim;
  if (o.layers > 0) args.n_layers = o.layers;
  if (o.heads > 0) {
    args.n_heads = o.heads;
    args.n_kv_heads = o.heads;  // multi-head unless --kv-heads says otherwise
  }
  if (o.kv_heads > 0) args.n_kv_heads = o.kv_heads;
  const bool custom = args.dim != shorthand.dim || args.n_layers != shorthand.n_layers ||
                      args.n_heads != shorthand.n_heads || args.kv_heads() != shorthand.kv_heads();
  try {
    args.validate();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "invalid shape: %s\n", e.what());
    return 2;
  }
  const runtime::DType dtype = o.dtype == "bf16" ? runtime::DType::BF16 : runtime::DType::F32;

  auto model = spec.build({.seed = 0, .dtype = dtype});
  runtime::optim::AdamW optimizer(model->named_parameters(), {.lr = 1e-4});
  const runtime::RandomKey key(0, "bench.tokens");
  const Tensor tokens =
      runtime::rand({o.batch, o.seq + 1}, key, {}, 0, double(o.vocab)).to(runtime::DType::I64);
  const Tensor inputs = tokens.narrow(1, 0, o.seq).contiguous();
  const Tensor targets = tokens.narrow(1, 1, o.seq).contiguous();

  double loss = 0, seconds = 0, warmup_seconds = 0;
  bool step_peak_known = false;
  for (int64_t step = 0; step < o.warmup + o.steps; ++step) {
    if (step == o.warmup) step_peak_known = reset_peak_rss();
    const bool profiled = o.profile && step + 1 == o.warmup + o.steps;
    if (profiled) runtime::Profiler::start(runtime::Device::cpu());
    const auto t0 = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    Tensor l = spec.loss(*model, inputs, targets, runtime::Reduction::Mean);
    l.backward();
    optimizer.step();
    loss = l.item<double>();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (step >= o.warmup ? seconds : warmup_seconds) += dt;
    if (profiled) std::printf("%s", runtime::Profiler::stop().summary(20).c_str());
  }
  const double step_peak = step_peak_known ? peak_rss_mib() : NAN;
  const double tokens_per_s = double(o.batch * o.seq * o.steps) / seconds;
  std::printf("framework=minititan model=%s dim=%lld layers=%lld heads=%lld kv_heads=%lld "
              "dtype=%s params=%lld batch=%lld seq=%lld tokens_per_s=%.1f step_ms=%.2f "
              "loss=%.4f warmup_s=%.1f peak_mib=%.1f peak_rss_mib=%.1f step_peak_rss_mib=%.1f\n",
              custom ? "custom" : o.model.c_str(), (long long)args.dim, (long long)args.n_layers,
              (long long)args.n_heads, (long long)args.kv_heads(), o.dtype.c_str(),
              (long long)spec.num_params(), (long long)o.batch, (long long)o.seq, tokens_per_s,
              1e3 * seconds / double(o.steps), loss, warmup_seconds,
              double(runtime::memory_stats(runtime::Device::cpu()).peak_bytes_in_use) / (1 << 20),
              peak_rss_mib(), step_peak);
  return 0;
}
