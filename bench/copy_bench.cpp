// CPU copies of transposed views (Tensor::copy_ of a .t() into a contiguous tensor: the tiled
// path of runtime/cpu/copy.cpp) against a contiguous copy of the same bytes, f32, best of --reps.
//   OMP_NUM_THREADS=2 ./build/bench/copy_bench [--reps 5]
#include <cstdio>
#include <utility>

#include "bench/bench_args.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/factory.h"

namespace mt::runtime {
namespace {

int run(int argc, char** argv) {
  const int reps = bench::parse_reps(argc, argv, 5);
  if (reps < 0) return 2;
  std::printf(
      "| f32 [rows, cols] | transposed copy ms | contiguous copy ms |\n| --- | --- | --- |\n");
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{50257, 256}, {256, 50257}, {4096, 4096}}) {
    const Tensor source = randn({cols, rows}, RandomKey(1, "source"));
    const Tensor same_layout = randn({rows, cols}, RandomKey(1, "source"));
    const Tensor dst = Tensor::empty({rows, cols});
    dst.copy_(same_layout);  // first touch outside the timing
    const double transposed = bench::best_ms(reps, [&] { dst.copy_(source.t()); });
    const double contiguous = bench::best_ms(reps, [&] { dst.copy_(same_layout); });
    std::printf("| [%lld, %lld] | %.1f | %.1f |\n", (long long)rows, (long long)cols, transposed,
                contiguous);
  }
  return 0;
}

}  // namespace
}  // namespace mt::runtime

int main(int argc, char** argv) { return mt::runtime::run(argc, argv); }
