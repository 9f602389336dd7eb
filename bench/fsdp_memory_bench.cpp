// FSDP memory and communication per rank: run under `mpirun -np N` (N = 1 too).
//
//   mpirun -np 4 build/bench/fsdp_memory_bench [--steps 4] [--batch 8] [--seq 128]
//
// Trains the Llama 3 debugmodel (vocab 2048, the demo's) with AdamW for a few steps on random
// tokens, FSDP over all ranks (N > 1), and prints, from rank 0:
// - the bytes of parameters + gradients + optimizer state held by a rank (the largest over the
//   ranks; storages counted once, padding included), next to the goal: 1/N of the single-process
//   bytes (measured on rank 0 with an unsharded copy of the model) plus one group's unsharded
//   parameters, and the allocator's bytes in use after a step and peak during it;
// - the time per step and the share of it the collectives ran (async ones overlap compute, so
//   this is an upper bound of the exposed communication).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "bench/training_state_bytes.h"
#include "models/llama/model.h"
#include "models/llama/parallelize.h"
#include "models/registry.h"
#include "parallel/clip_grad.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/fsdp/fully_shard.h"
#include "runtime/core/allocator.h"
#include "runtime/core/rng.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "runtime/optim/adamw.h"
#include "tools/flags.h"

namespace {

using namespace mt;
using runtime::Tensor;

struct Options {
  int64_t steps = 4, batch = 8, seq = 128;
};


Tensor batch_tokens(int64_t step, int64_t batch, int64_t seq, int64_t vocab) {
  Tensor u = runtime::rand({batch, seq + 1}, runtime::RandomKey(1, "fsdp_bench", uint64_t(step)));
  return runtime::mul(u, double(vocab) - 1e-6).to(runtime::DType::I64);
}

// One optimizer step on this rank's rows of the global batch.
void train_step(runtime::nn::Module& model, runtime::optim::Optimizer& opt, const Tensor& rows,
                double global_tokens, bool sharded) {
  opt.zero_grad();
  auto& llama = dynamic_cast<models::llama::Transformer&>(model);
  const int64_t seq = rows.size(1) - 1;
  Tensor logits = llama(rows.narrow(1, 0, seq).contiguous());
  Tensor loss = runtime::cross_entropy(logits, rows.narrow(1, 1, seq).contiguous(), -100,
                                       runtime::Reduction::Sum);
  runtime::mul(loss, 1.0 / global_tokens).backward();
  if (sharded) {
    parallel::clip_grad_norm_(parallel::distributed_parameters(model), 1.0);
  }
  opt.step();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  tools::FlagReader flags("fsdp_memory_bench", argc, argv);
  while (flags.next()) {
    if (flags.is("--steps")) o.steps = flags.int_value();
    else if (flags.is("--batch")) o.batch = flags.int_value();
    else if (flags.is("--seq")) o.seq = flags.int_value();
    else flags.unknown();
  }
  auto world = std::shared_ptr<parallel::ProcessGroup>(parallel::MpiProcessGroup::world());
  const int64_t n = world->size(), rank = world->rank();
  if (o.batch % n != 0) {
    if (rank == 0) std::fprintf(stderr, "--batch %lld must be a multiple of %lld ranks\n",
                                (long long)o.batch, (long long)n);
    return 2;
  }
  auto spec = models::get_model_spec("llama3", "debugmodel");
  auto& args = std::any_cast<models::llama::ModelArgs&>(*spec.args);
  args.vocab_size = 2048;
  args.max_seq_len = o.seq;
  const double global_tokens = double(o.batch * o.seq);

  // Single-process bytes, measured on rank 0 with an unsharded model.
  int64_t single_bytes = 0;
  if (rank == 0) {
    auto ref = std::make_shared<models::llama::Transformer>(args, 0);
    runtime::optim::AdamW opt(ref->named_parameters());
    train_step(*ref, opt, batch_tokens(0, o.batch, o.seq, args.vocab_size), global_tokens, false);
    single_bytes = bench::training_state_bytes(ref->parameters(), opt);
  }

  auto model = std::make_shared<models::llama::Transformer>(args, 0);
  int64_t largest_group = 0;
  std::shared_ptr<parallel::DeviceMesh> mesh;
  if (n > 1) {
    mesh = parallel::DeviceMesh::create(world, {n}, {"dp_shard"});
    models::ParallelContext ctx;
    ctx.dp_mesh = mesh;
    models::llama::parallelize(*model, ctx);
  }
  runtime::optim::AdamW opt(model->named_parameters());
  const int64_t local = o.batch / n;
  auto rows_of = [&](int64_t step) {
    return batch_tokens(step, o.batch, o.seq, args.vocab_size).narrow(0, rank * local, local);
  };
  train_step(*model, opt, rows_of(0), global_tokens, n > 1);  // warm-up: state allocated

  parallel::ProcessGroup& fsdp_group = mesh ? mesh->group(0) : *world;
  fsdp_group.reset_stats();
  runtime::reset_peak_memory(runtime::Device::cpu());
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 1; s <= o.steps; ++s) train_step(*model, opt, rows_of(s), global_tokens, n > 1);
  const double step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
      double(o.steps);
  const runtime::MemoryStats mem = runtime::memory_stats(runtime::Device::cpu());

  const int64_t mine = bench::training_state_bytes(model->parameters(), opt);
  // Unsharded bytes of the largest FSDP group (a block, or the root: embeddings, norm, output),
  // from the parameters' global shapes.
  {
    std::map<std::string, int64_t> per_group;
    for (const auto& p : parallel::distributed_parameters(*model)) {
      const auto dot = p.fqn.find('.', p.fqn.rfind("layers.", 0) == 0 ? 7 : 0);
      const std::string group = p.fqn.rfind("layers.", 0) == 0 ? p.fqn.substr(0, dot) : "root";
      int64_t numel = 1;
      for (int64_t d : (p.dtensor ? p.dtensor->global_shape : p.param.shape())) numel *= d;
      per_group[group] += numel * 4;
    }
    for (const auto& [g, b] : per_group) largest_group = std::max(largest_group, b);
  }
  double comm_seconds = 0;
  std::string comm_detail;
  for (const auto& [name, st] : fsdp_group.stats()) {
    comm_seconds += st.seconds;
    comm_detail += " " + name + ":" + std::to_string(st.calls / o.steps) + "x" +
                   std::to_string(st.bytes / std::max<int64_t>(st.calls, 1) / 1024) + "KiB";
  }
  comm_seconds /= double(o.steps);
  Tensor maxes = runtime::from_vector<double>(
      {double(mine), double(mem.bytes_in_use), double(mem.peak_bytes_in_use), comm_seconds,
       step_seconds},
      {5}, {runtime::DType::F64});
  world->all_reduce(maxes, parallel::ReduceOp::Max, "bench.max");
  const auto m = maxes.to_vector<double>();
  if (rank == 0) {
    const double mib = 1024.0 * 1024.0;
    const double goal = double(single_bytes) / double(n) + (n > 1 ? double(largest_group) : 0.0);
    std::printf("| N | params+grads+AdamW per rank (MiB) | 1-process (MiB) | goal: 1/N + one group "
                "(MiB) | ratio to goal | allocator in use after step / peak in step (MiB) | "
                "step (s) | comm share |\n");
    std::printf("| %lld | %.2f | %.2f | %.2f | %.3f | %.1f / %.1f | %.3f | %.1f%% |\n",
                (long long)n, m[0] / mib, double(single_bytes) / mib, goal / mib,
                m[0] / std::max(goal, 1.0), m[1] / mib, m[2] / mib, m[4],
                100.0 * m[3] / std::max(m[4], 1e-12));
    std::printf("collectives per step on rank 0:%s\n", comm_detail.empty() ? " none" : comm_detail.c_str());
  }
  return 0;
}
