// Tokens/s of one Llama training step on the CPU (forward, token cross-entropy, backward, AdamW),
// for the side-by-side comparison with PyTorch in bench/compare_train_step.sh. Prints one line of
// `key=value` fields (parsed by that script).
//
//   llama_train_step_bench --model debugmodel|20M --batch 8 --seq 256 --steps 10 --warmup 3
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  int64_t batch = 8, seq = 256, steps = 10, warmup = 3, vocab = 2000;
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
    else if (flag == "--batch") o.batch = std::atoll(value);
    else if (flag == "--seq") o.seq = std::atoll(value);
    else if (flag == "--steps") o.steps = std::atoll(value);
    else if (flag == "--warmup") o.warmup = std::atoll(value);
    else if (flag == "--vocab") o.vocab = std::atoll(value);
    else if (flag == "--profile") o.profile = std::atoi(value) != 0;
    else {
      std::fprintf(stderr,
                   "unknown flag %s (valid: --model --batch --seq --steps --warmup --vocab "
                   "--profile 0|1)\n",
                   flag.c_str());
      std::exit(2);
    }
  }
  if (o.model != "debugmodel" && o.model != "20M") {
    std::fprintf(stderr, "--model must be debugmodel or 20M\n");
    std::exit(2);
  }
  return o;
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
  }
  auto model = spec.build({.seed = 0});
  runtime::optim::AdamW optimizer(model->named_parameters(), {.lr = 1e-4});
  const runtime::RandomKey key(0, "bench.tokens");
  const Tensor tokens =
      runtime::rand({o.batch, o.seq + 1}, key, {}, 0, double(o.vocab)).to(runtime::DType::I64);
  const Tensor inputs = tokens.narrow(1, 0, o.seq).contiguous();
  const Tensor targets = tokens.narrow(1, 1, o.seq).contiguous();

  double loss = 0, seconds = 0;
  for (int64_t step = 0; step < o.warmup + o.steps; ++step) {
    const bool profiled = o.profile && step + 1 == o.warmup + o.steps;
    if (profiled) runtime::Profiler::start(runtime::Device::cpu());
    const auto t0 = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    Tensor l = spec.loss(*model, inputs, targets, runtime::Reduction::Mean);
    l.backward();
    optimizer.step();
    loss = l.item<double>();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step >= o.warmup) seconds += dt;
    if (profiled) std::printf("%s", runtime::Profiler::stop().summary(20).c_str());
  }
  const double tokens_per_s = double(o.batch * o.seq * o.steps) / seconds;
  std::printf("framework=minititan model=%s params=%lld batch=%lld seq=%lld tokens_per_s=%.1f "
              "step_ms=%.2f loss=%.4f peak_mib=%.1f\n",
              o.model.c_str(), (long long)spec.num_params(), (long long)o.batch, (long long)o.seq,
              tokens_per_s, 1e3 * seconds / double(o.steps), loss,
              double(runtime::memory_stats(runtime::Device::cpu()).peak_bytes_in_use) / (1 << 20));
  return 0;
}
