// rms_norm: the fused kernels against the same computation composed from unfused runtime ops
// (square, mean, add, rsqrt, mul), forward and forward+backward, f32. Bytes/s counts the minimum
// traffic of the fused version (forward: read x, write y; backward: read dy and x, write dx), so
// both variants are measured against the same work and the ratio of GB/s is the speed-up.
//   ./build/bench/rms_norm_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/rms_norm.h"

namespace mt::runtime {
namespace {

constexpr double kEps = 1e-6;

Tensor composed_rms_norm(const Tensor& x, const Tensor& w) {
  return mul(mul(x, rsqrt(add(mean(square(x), {-1}, true), kEps))), w);
}

template <bool kComposed, bool kBackward>
void BM_RmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0), d = state.range(1);
  Tensor x = randn({rows, d}, RandomKey(1, "x")).set_requires_grad(kBackward);
  Tensor w = randn({d}, RandomKey(2, "w")).set_requires_grad(kBackward);
  const Tensor dy = randn({rows, d}, RandomKey(3, "dy"));
  for (auto _ : state) {
    Tensor y = kComposed ? composed_rms_norm(x, w) : rms_norm(x, w, kEps);
    if constexpr (kBackward) {
      y.backward(dy);
      x.set_grad(Tensor());
      w.set_grad(Tensor());
    }
    benchmark::DoNotOptimize(y.data_ptr());
  }
  const int64_t bytes_per_iter = rows * d * 4 * (kBackward ? 5 : 2);
  state.SetBytesProcessed(state.iterations() * bytes_per_iter);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "D"})
      ->Args({2048, 1024})
      ->Args({512, 4096})
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_RmsNorm<false, false>)->Name("rms_norm/fused/forward")->Apply(Shapes);
BENCHMARK(BM_RmsNorm<true, false>)->Name("rms_norm/composed/forward")->Apply(Shapes);
BENCHMARK(BM_RmsNorm<false, true>)->Name("rms_norm/fused/forward_backward")->Apply(Shapes);
BENCHMARK(BM_RmsNorm<true, true>)->Name("rms_norm/composed/forward_backward")->Apply(Shapes);

}  // namespace
}  // namespace mt::runtime

BENCHMARK_MAIN();
