// MoE costs, in one run (CPU, f32):
//  A. The grouped matmul of the routed experts against one dense matmul of the same total FLOPs
//     (2 N K M), forward and forward + backward, with balanced and skewed tokens per expert.
//  B. One training step of a small DeepSeek-V3-style model with expert parallelism over every
//     rank (ep = world size, FSDP on the rest): step time, and the share of it spent in the
//     expert dispatch/combine all-to-alls (forward and backward, counts exchange included) and in
//     FSDP's collectives, from the process groups' own per-call timers.
//   OMP_NUM_THREADS=1 mpirun -np 2 build/bench/moe_bench       (or alone: ep = 1, no exchange)
#include <algorithm>
#include <any>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "models/moe/model_args.h"
#include "models/parallel_context.h"
#include "models/registry.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/autograd/engine.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/grouped_matmul.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"

using namespace mt;
using runtime::Tensor;

namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of `reps` calls after 2 warm-ups.
double median_seconds(int reps, const std::function<void()>& fn) {
  for (int i = 0; i < 2; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void grouped_vs_dense() {
  const int64_t n = 8192, k = 256, m = 512, experts = 8;  // 4096 tokens x top 2
  const Tensor x = runtime::randn({n, k}, runtime::RandomKey(1, "x")).set_requires_grad(true);
  const Tensor w = runtime::randn({experts, m, k}, runtime::RandomKey(2, "w")).set_requires_grad(true);
  const Tensor dense_w = runtime::randn({m, k}, runtime::RandomKey(3, "dw")).set_requires_grad(true);
  const std::vector<int64_t> balanced(size_t(experts), n / experts);
  // Skewed: one expert takes 40% of the rows, two take none.
  const std::vector<int64_t> skewed = {3277, 1229, 1229, 819, 819, 819, 0, 0};
  const double flops = 2.0 * n * k * m;
  std::printf("A. grouped matmul (%lld experts) vs one dense matmul of the same FLOPs: "
              "x [%lld, %lld] -> [%lld, %lld], f32\n",
              (long long)experts, (long long)n, (long long)k, (long long)n, (long long)m);
  std::printf("   %-28s %12s %12s %10s\n", "variant", "fwd GFLOP/s", "f+b GFLOP/s", "vs dense");
  auto row = [&](const char* name, const std::function<Tensor()>& fwd, double dense_fb) {
    runtime::NoGradGuard no_grad;
    const double f = median_seconds(9, [&] { fwd(); });
    runtime::GradMode::set_enabled(true);
    const double fb = median_seconds(9, [&] {
      runtime::autograd::backward({runtime::sum(fwd())});
    });
    runtime::GradMode::set_enabled(false);
    std::printf("   %-28s %12.1f %12.1f %9.2fx\n", name, flops / f / 1e9, 3 * flops / fb / 1e9,
                dense_fb > 0 ? dense_fb / fb : 1.0);
    return fb;
  };
  const double dense_fb = row("dense matmul", [&] { return runtime::linear(x, dense_w); }, 0);
  row("grouped, balanced", [&] { return runtime::grouped_mm(x, w, balanced); }, dense_fb);
  row("grouped, skewed (40% on one)", [&] { return runtime::grouped_mm(x, w, skewed); }, dense_fb);
}

void expert_parallel_step(std::shared_ptr<parallel::ProcessGroup> world) {
  const int64_t ranks = world->size();
  models::ModelSpec spec = models::get_model_spec("deepseek_v3", "moe_debug");
  auto& a = std::any_cast<models::moe::ModelArgs&>(*spec.args);
  a.dim = 256;
  a.n_heads = 8;
  a.n_kv_heads = 4;
  a.n_layers = 4;
  a.moe_inter_dim = 512;
  a.inter_dim = 1024;
  a.n_routed_experts = 8;
  a.vocab_size = 2048;
  const int64_t batch = 4, seq = 512;
  a.max_seq_len = seq;
  auto model = spec.build({.seed = 1});
  models::ParallelContext ctx;
  ctx.dp_mesh = parallel::DeviceMesh::create(world, {ranks}, {"dp_shard"});
  ctx.expert_mesh =
      parallel::DeviceMesh::create(world, {1, ranks, 1}, {"dp_replicate", "ep", "efsdp"});
  ctx.gradient_divide_factor = double(ranks);
  spec.parallelize(*model, ctx);
  const Tensor tokens = runtime::mul(
      runtime::rand({batch, seq + 1}, runtime::RandomKey(9, "tokens", uint64_t(world->rank()))),
      double(a.vocab_size)).to(runtime::DType::I64);
  const Tensor inputs = tokens.narrow(1, 0, seq).contiguous(), targets = tokens.narrow(1, 1, seq).contiguous();
  auto step = [&] {
    for (const auto& p : model->parameters()) p.set_grad(Tensor());
    spec.loss(*model, inputs, targets, runtime::Reduction::Mean).backward();
    world->barrier("bench.step");
  };
  step();
  auto& ep_group = ctx.expert_mesh->group("ep");
  auto& dp_group = ctx.dp_mesh->group(0);
  ep_group.reset_stats();
  dp_group.reset_stats();
  const int steps = 5;
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double step_s = std::chrono::duration<double>(Clock::now() - t0).count() / steps;
  double ep_s = 0, fsdp_s = 0;
  int64_t ep_bytes = 0;
  for (const auto& [name, s] : ep_group.stats()) {
    if (name.starts_with("ep.")) {
      ep_s += s.seconds;
      ep_bytes += s.bytes;
    }
  }
  for (const auto& [name, s] : dp_group.stats()) {
    if (name.starts_with("fsdp.")) fsdp_s += s.seconds;
  }
  ep_s /= steps;
  fsdp_s /= steps;
  if (world->rank() != 0) return;
  std::printf("\nB. training step (forward + backward) of a %lld-layer MoE (dim %lld, %lld experts "
              "of hidden %lld, top %lld) with ep = %lld, %lld x %lld tokens per rank, f32\n",
              (long long)a.n_layers, (long long)a.dim, (long long)a.n_routed_experts,
              (long long)a.moe_inter_dim, (long long)a.top_k, (long long)ranks, (long long)batch,
              (long long)seq);
  std::printf("   step %.1f ms; expert dispatch/combine %.1f ms (%.1f%%, %.2f MiB per step on "
              "rank 0); FSDP collectives %.1f ms (%.1f%%)\n",
              step_s * 1e3, ep_s * 1e3, 100 * ep_s / step_s, double(ep_bytes) / steps / (1 << 20),
              fsdp_s * 1e3, 100 * fsdp_s / step_s);
}

}  // namespace

int main() {
  std::shared_ptr<parallel::ProcessGroup> world(parallel::MpiProcessGroup::world());
  try {
    if (world->rank() == 0) grouped_vs_dense();
    world->barrier("bench.part_a");
    expert_parallel_step(world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
