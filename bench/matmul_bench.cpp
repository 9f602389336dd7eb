// f32 matmul: our op (output allocation, checks, autograd bookkeeping and the kernel) against
// raw cblas_sgemm on the same input buffers, in the same binary. Reports GFLOP/s; the ratio
// ours / cblas is the op's overhead (goal: >= 0.85). On CPUs with AVX-512 our f32 matmul runs
// oneDNN's kernels (runtime/cpu/onednn_gemm.h), so there the ratio compares the two libraries;
// MT_CPU_F32_GEMM=openblas measures the overhead again.
//
//   ./build/bench/matmul_bench --benchmark_min_time=0.2
//
// Shapes: square 512^3 and 1024^3, M x K x N = 2048 x 2048 x 512, and Llama-style linear layers
// x[B, T, C] @ W[out, C]^T (the transposed weight is passed to BLAS as a view, no copy).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <utility>
#include <vector>

#include "runtime/ops/factory.h"
#include "runtime/ops/matmul.h"

namespace {

using mt::runtime::DType;
using mt::runtime::RandomKey;
using mt::runtime::Tensor;

Tensor random_f32(const mt::runtime::Shape& shape, const char* name) {
  return mt::runtime::randn(shape, RandomKey(0, name), {});
}

void set_gflops(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOP"] = benchmark::Counter(flops_per_iter * double(state.iterations()) * 1e-9,
                                               benchmark::Counter::kIsRate);
}

// args: M, K, N.  a [M, K] @ b [K, N].
void BM_MatmulOurs(benchmark::State& state) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2);
  Tensor a = random_f32({M, K}, "a"), b = random_f32({K, N}, "b");
  for (auto _ : state) {
    Tensor c = mt::runtime::matmul(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  set_gflops(state, 2.0 * M * N * K);
}

void BM_MatmulCblas(benchmark::State& state) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2);
  Tensor a = random_f32({M, K}, "a"), b = random_f32({K, N}, "b");
  Tensor c = Tensor::empty({M, N});
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(M), int(N), int(K), 1.0f,
                a.data<float>(), int(K), b.data<float>(), int(N), 0.0f, c.data<float>(), int(N));
    benchmark::DoNotOptimize(c.data_ptr());
  }
  set_gflops(state, 2.0 * M * N * K);
}

// args: B, T, C, out.  x [B, T, C] @ W[out, C]^T through matmul(x, w, false, true): the batch
// folds into one GEMM and W^T is a BLAS transpose flag.
void BM_LinearOurs(benchmark::State& state) {
  const int64_t B = state.range(0), T = state.range(1), C = state.range(2), O = state.range(3);
  Tensor x = random_f32({B, T, C}, "x"), w = random_f32({O, C}, "w");
  for (auto _ : state) {
    Tensor y = mt::runtime::matmul(x, w, false, true);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  set_gflops(state, 2.0 * B * T * C * O);
}

void BM_LinearCblas(benchmark::State& state) {
  const int64_t B = state.range(0), T = state.range(1), C = state.range(2), O = state.range(3);
  Tensor x = random_f32({B, T, C}, "x"), w = random_f32({O, C}, "w");
  Tensor y = Tensor::empty({B, T, O});
  const int rows = int(B * T);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, int(O), int(C), 1.0f,
                x.data<float>(), int(C), w.data<float>(), int(C), 0.0f, y.data<float>(), int(O));
    benchmark::DoNotOptimize(y.data_ptr());
  }
  set_gflops(state, 2.0 * B * T * C * O);
}

}  // namespace

using Entry = std::pair<const char*, void (*)(benchmark::State&)>;

// Ours and cblas registered shape by shape, so each pair runs back to back.
int main(int argc, char** argv) {
  const std::vector<std::vector<int64_t>> matmul_shapes = {
      {512, 512, 512}, {1024, 1024, 1024}, {2048, 2048, 512}};
  for (const auto& s : matmul_shapes) {
    for (auto [name, fn] :
         {Entry{"matmul/ours", BM_MatmulOurs}, Entry{"matmul/cblas", BM_MatmulCblas}})
      benchmark::RegisterBenchmark(name, fn)
          ->Args(s)
          ->ArgNames({"M", "K", "N"})
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  }
  const std::vector<std::vector<int64_t>> linear_shapes = {
      {4, 256, 768, 768}, {4, 256, 1024, 4096}, {8, 512, 512, 512}};
  for (const auto& s : linear_shapes) {
    for (auto [name, fn] :
         {Entry{"linear_xWt/ours", BM_LinearOurs}, Entry{"linear_xWt/cblas", BM_LinearCblas}})
      benchmark::RegisterBenchmark(name, fn)
          ->Args(s)
          ->ArgNames({"B", "T", "C", "out"})
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  }
  {  // Warm-up: start OpenBLAS's threads and fault in the heap before the first timing.
    Tensor a = random_f32({1024, 1024}, "a"), b = random_f32({1024, 1024}, "b");
    for (int i = 0; i < 5; ++i) benchmark::DoNotOptimize(mt::runtime::matmul(a, b).data_ptr());
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
