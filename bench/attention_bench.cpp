// Attention: the fused memory-efficient kernels (scaled_dot_product_attention) against the same
// computation composed from runtime ops (matmul with transpose_b, mask, softmax, matmul), which
// materialises the [T, S] scores and probabilities. f32, multi-head, causal and not.
// Counters: GFLOP/s of the useful work (forward 4*B*H*T*S*D, halved when causal; forward+backward
// counted as 3.5x the forward, the flash-attention convention) and tokens/s (B*T per iteration).
// Both variants are credited with the same flops, so the ratio of GFLOP/s is the speed-up.
//   ./build/bench/attention_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cmath>
#include <limits>
#include <vector>

#include "runtime/ops/attention.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/softmax.h"

namespace mt::runtime {
namespace {

// [T, S] additive mask: 0 where key j is visible to query i (j <= i + S - T), -inf elsewhere.
Tensor causal_mask(int64_t t, int64_t s) {
  std::vector<double> m(size_t(t * s));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < s; ++j)
      m[i * s + j] = j <= i + s - t ? 0.0 : -std::numeric_limits<double>::infinity();
  return from_vector<double>(m, {t, s});
}

Tensor composed_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                          double scale) {
  Tensor scores = mul(matmul(q, k, false, true), scale);
  if (mask.defined()) scores = add(scores, mask);
  return matmul(softmax(scores, -1), v);
}

template <bool kComposed, bool kBackward>
void BM_Attention(benchmark::State& state) {
  const int64_t b = state.range(0), h = state.range(1), t = state.range(2), d = state.range(3);
  const bool causal = state.range(4) != 0;
  Tensor q = randn({b, h, t, d}, RandomKey(1, "q")).set_requires_grad(kBackward);
  Tensor k = randn({b, h, t, d}, RandomKey(2, "k")).set_requires_grad(kBackward);
  Tensor v = randn({b, h, t, d}, RandomKey(3, "v")).set_requires_grad(kBackward);
  const Tensor dy = randn({b, h, t, d}, RandomKey(4, "dy"));
  const Tensor mask = causal ? causal_mask(t, t) : Tensor();
  const double scale = 1.0 / std::sqrt(double(d));
  for (auto _ : state) {
    Tensor y = kComposed ? composed_attention(q, k, v, mask, scale)
                         : scaled_dot_product_attention(q, k, v, causal);
    if constexpr (kBackward) {
      y.backward(dy);
      for (const Tensor& x : {q, k, v}) x.set_grad(Tensor());
    }
    benchmark::DoNotOptimize(y.data_ptr());
  }
  const double fwd_flops = 4.0 * double(b * h * t * t * d) * (causal ? 0.5 : 1.0);
  const double flops = fwd_flops * (kBackward ? 3.5 : 1.0);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] =
      benchmark::Counter(double(b * t), benchmark::Counter::kIsIterationInvariantRate);
}

void Shapes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"B", "H", "T", "D", "causal"})
      ->Args({1, 8, 512, 64, 1})
      ->Args({1, 8, 512, 64, 0})
      ->Args({8, 6, 256, 64, 1})  // the ~20M model's training step (llama_train_step_bench)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Attention<false, false>)->Name("attention/fused/forward")->Apply(Shapes);
BENCHMARK(BM_Attention<true, false>)->Name("attention/composed/forward")->Apply(Shapes);
BENCHMARK(BM_Attention<false, true>)->Name("attention/fused/forward_backward")->Apply(Shapes);
BENCHMARK(BM_Attention<true, true>)->Name("attention/composed/forward_backward")->Apply(Shapes);

}  // namespace
}  // namespace mt::runtime

BENCHMARK_MAIN();
