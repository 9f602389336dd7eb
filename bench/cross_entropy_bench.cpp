// Cross-entropy, fused (ops/loss.h: per-row logsumexp forward, softmax rebuilt on the fly in
// backward) against the composition of unfused ops, -sum(onehot * log_softmax(logits)) / N, on
// the same f32 logits. Forward alone and forward + backward. Reports tokens/s and the logits
// bytes per second (N * V * 4 / time: how fast the whole [N, V] tensor is processed).
//
//   ./build/bench/cross_entropy_bench --benchmark_min_time=0.2
//
// The composed version gets its one-hot matrix built once outside the timed loop (in its favour).
#include <benchmark/benchmark.h>

#include <utility>
#include <vector>

#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/softmax.h"

namespace {

using mt::runtime::DType;
using mt::runtime::RandomKey;
using mt::runtime::Tensor;
using mt::runtime::TensorOptions;

struct Inputs {
  Tensor logits, targets, onehot;
};

Inputs make_inputs(int64_t N, int64_t V, bool requires_grad) {
  namespace rt = mt::runtime;
  Inputs in;
  in.logits =
      rt::randn({N, V}, RandomKey(0, "logits"), TensorOptions{}.with_requires_grad(requires_grad));
  std::vector<int64_t> t(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) t[i] = (i * 7919) % V;
  in.targets = rt::from_vector<int64_t>(t, {N}, TensorOptions{}.with_dtype(DType::I64));
  Tensor classes = rt::arange(V).unsqueeze(0);                          // [1, V]
  in.onehot = rt::eq(in.targets.unsqueeze(1), classes).to(DType::F32);  // [N, V]
  return in;
}

Tensor composed_loss(const Inputs& in) {
  namespace rt = mt::runtime;
  Tensor logp = rt::log_softmax(in.logits, -1);
  return rt::div(rt::neg(rt::sum(rt::mul(in.onehot, logp))), double(in.logits.size(0)));
}

void set_counters(benchmark::State& state, int64_t N, int64_t V) {
  const double it = double(state.iterations());
  state.counters["tokens"] = benchmark::Counter(double(N) * it, benchmark::Counter::kIsRate);
  state.counters["logits_GB"] =
      benchmark::Counter(double(N) * double(V) * 4.0 * it * 1e-9, benchmark::Counter::kIsRate);
}

// args: N (tokens), V (vocabulary); range(2): 1 = forward + backward.
void BM_Fused(benchmark::State& state) {
  const int64_t N = state.range(0), V = state.range(1);
  const bool backward = state.range(2) != 0;
  Inputs in = make_inputs(N, V, backward);
  for (auto _ : state) {
    Tensor loss = mt::runtime::cross_entropy(in.logits, in.targets);
    if (backward) {
      in.logits.set_grad(Tensor());
      loss.backward();
    }
    benchmark::DoNotOptimize(loss.data_ptr());
  }
  set_counters(state, N, V);
}

void BM_Composed(benchmark::State& state) {
  const int64_t N = state.range(0), V = state.range(1);
  const bool backward = state.range(2) != 0;
  Inputs in = make_inputs(N, V, backward);
  for (auto _ : state) {
    Tensor loss = composed_loss(in);
    if (backward) {
      in.logits.set_grad(Tensor());
      loss.backward();
    }
    benchmark::DoNotOptimize(loss.data_ptr());
  }
  set_counters(state, N, V);
}

}  // namespace

using Entry = std::pair<const char*, void (*)(benchmark::State&)>;

// Fused and composed registered shape by shape, so each pair runs back to back.
int main(int argc, char** argv) {
  const std::vector<std::vector<int64_t>> shapes = {
      {1024, 32000, 0}, {1024, 32000, 1}, {4096, 8192, 0}, {4096, 8192, 1}};
  for (const auto& s : shapes) {
    for (auto [name, fn] :
         {Entry{"cross_entropy/fused", BM_Fused}, Entry{"cross_entropy/composed", BM_Composed}})
      benchmark::RegisterBenchmark(name, fn)
          ->Args(s)
          ->ArgNames({"N", "V", "bwd"})
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
