// Tensor parallelism per rank: memory, communication and step time. Run under `mpirun -np N`.
//
//   mpirun -np 2 build/bench/tp_bench --tp 2 [--sp 1] [--model debug|20M] [--steps 4]
//       [--batch 8] [--seq 256]
//
// Trains a Llama (the debugmodel, vocab 2000, or the ~20M: dim 384, 10 layers, 6 heads) with
// AdamW for a few steps on random tokens, f32, on the mesh (dp_shard = N / tp, tp): llama's TP
// plan (models/llama/parallelize.h), loss parallel, FSDP over dp_shard. The global batch is
// --batch sequences (each dp rank takes batch / dp). Prints, from rank 0, one Markdown row:
// - params + grads + AdamW bytes held by a rank (distinct storages; the largest over the ranks)
//   beside the goal: the TP-split parameters' one-process bytes / (tp x dp) plus the replicated
//   ones (norm weights) / dp — exact when every split is even;
// - the allocator's peak during a step above what it held before it (activations, gathered
//   weights, temporaries): compare --sp 1 with --sp 0;
// - the bytes the tp group moved per step (all-gathers: output bytes; reduce-scatters and
//   all-reduces: input bytes) beside Megatron-style TP+SP's count for the blocks (per block
//   forward 2 all-gathers + 2 reduce-scatters of [tokens, dim], backward the same; without SP,
//   2 + 2 all-reduces of [tokens, dim]), and the rest (embedding, output, loss, norm weights);
// - the time per step.
#include <chrono>
#include <cstdio>
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
#include "parallel/tensor/dtensor_ops.h"
#include "runtime/core/allocator.h"
#include "runtime/core/rng.h"
#include "runtime/nn/init.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/optim/adamw.h"
#include "tools/flags.h"

namespace {

using namespace mt;
using runtime::Tensor;

struct Options {
  int64_t tp = 2, steps = 4, batch = 8, seq = 256;
  bool sp = true;
  std::string model = "debug";
};


}  // namespace

int main(int argc, char** argv) {
  Options o;
  tools::FlagReader flags("tp_bench", argc, argv);
  while (flags.next()) {
    if (flags.is("--tp")) o.tp = flags.int_value();
    else if (flags.is("--sp")) o.sp = flags.int_value() != 0;
    else if (flags.is("--model")) o.model = flags.value();
    else if (flags.is("--steps")) o.steps = flags.int_value();
    else if (flags.is("--batch")) o.batch = flags.int_value();
    else if (flags.is("--seq")) o.seq = flags.int_value();
    else flags.unknown();
  }
  auto world = std::shared_ptr<parallel::ProcessGroup>(parallel::MpiProcessGroup::world());
  const int64_t n = world->size(), rank = world->rank();
  if (n % o.tp != 0 || o.batch % (n / o.tp) != 0) {
    if (rank == 0) std::fprintf(stderr, "tp must divide the ranks and dp the batch\n");
    return 2;
  }
  const int64_t dp = n / o.tp;
  auto spec = models::get_model_spec("llama3", "debugmodel");
  auto& args = std::any_cast<models::llama::ModelArgs&>(*spec.args);
  args.vocab_size = 2000;
  args.max_seq_len = o.seq;
  if (o.model == "20M") {
    args.dim = 384;
    args.n_layers = 10;
    args.n_heads = 6;
    args.n_kv_heads = 6;
  }

  std::shared_ptr<runtime::nn::Module> model;
  {
    runtime::nn::DeferredInitGuard no_values;
    model = std::make_shared<models::llama::Transformer>(args, 0);
  }
  auto mesh = parallel::DeviceMesh::create(world, {dp, o.tp}, {"dp_shard", "tp"});
  models::ParallelContext ctx;
  ctx.dp_mesh = mesh->submesh({"dp_shard"});
  ctx.gradient_divide_factor = 1.0;
  ctx.reshard_after_forward = dp > 1;
  if (o.tp > 1) {
    ctx.world_mesh = mesh;
    ctx.tp_mesh = mesh->submesh({"tp"});
    ctx.sequence_parallel = o.sp;
  }
  models::llama::parallelize(*model, ctx);
  parallel::init_sharded_parameters(*model, 0);
  auto& llama = dynamic_cast<models::llama::Transformer&>(*model);
  runtime::optim::AdamW opt(model->named_parameters());

  // The goal: split parameters' whole bytes x 16 (f32 param, grad, 2 AdamW moments) / n, the
  // replicated ones' / dp.
  double goal = 0;
  for (const auto& p : parallel::distributed_parameters(*model)) {
    int64_t numel = 1;
    for (int64_t d : p.dtensor->global_shape) numel *= d;
    bool split_by_tp = false;
    for (size_t i = 0; i < p.dtensor->placements.size(); ++i)
      if (p.dtensor->mesh->dim_names()[i] == "tp" && !parallel::is_replicate(p.dtensor->placements[i]))
        split_by_tp = true;
    goal += double(numel) * 16.0 / double(split_by_tp ? n : dp);
  }

  const int64_t local = o.batch / dp, dp_rank = rank / o.tp;
  const double global_tokens = double(o.batch * o.seq);
  auto step = [&](int64_t s) {
    Tensor u = runtime::rand({o.batch, o.seq + 1}, runtime::RandomKey(1, "tp_bench", uint64_t(s)));
    Tensor rows = runtime::mul(u, double(args.vocab_size) - 1e-6)
                      .to(runtime::DType::I64)
                      .narrow(0, dp_rank * local, local);
    opt.zero_grad();
    const Tensor inputs = rows.narrow(1, 0, o.seq).contiguous();
    const Tensor targets = rows.narrow(1, 1, o.seq).contiguous();
    Tensor loss = o.tp > 1 ? parallel::dtensor::vocab_parallel_cross_entropy(
                                 llama.loss_logits(inputs), targets, ctx.tp_mesh,
                                 args.vocab_size, -100, runtime::Reduction::Sum)
                           : runtime::cross_entropy(llama.loss_logits(inputs), targets, -100,
                                                    runtime::Reduction::Sum);
    runtime::mul(loss, 1.0 / global_tokens).backward();
    parallel::clip_grad_norm_(parallel::distributed_parameters(*model), 1.0);
    opt.step();
  };
  step(0);  // warm-up: optimizer state allocated

  parallel::ProcessGroup* tp_group = o.tp > 1 ? &ctx.tp_mesh->group(0) : nullptr;
  if (tp_group) tp_group->reset_stats();
  const runtime::MemoryStats before = runtime::memory_stats(runtime::Device::cpu());
  runtime::reset_peak_memory(runtime::Device::cpu());
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 1; s <= o.steps; ++s) step(s);
  const double step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(o.steps);
  const runtime::MemoryStats mem = runtime::memory_stats(runtime::Device::cpu());

  // Bytes per step by what they served.
  std::map<std::string, double> moved;
  if (tp_group) {
    for (const auto& [name, st] : tp_group->stats()) {
      const std::string what = name.find("loss_parallel") != std::string::npos ? "loss"
                               : name.ends_with(".grad")                        ? "norm weights"
                               : name.find("tok_embeddings") != std::string::npos ||
                                       name.find("'output'") != std::string::npos
                                   ? "embedding/output"
                                   : "blocks";
      moved[what] += double(st.bytes) / double(o.steps);
    }
  }
  const double tokens = double(local * o.seq), dim = double(args.dim);
  const double analytic_blocks = double(args.n_layers) * 8.0 * tokens * dim * 4.0 / (o.sp ? 1.0 : 2.0);

  Tensor maxes = runtime::from_vector<double>(
      {double(bench::training_state_bytes(model->parameters(), opt)),
       double(mem.peak_bytes_in_use - before.bytes_in_use), step_seconds},
      {3}, {runtime::DType::F64});
  world->all_reduce(maxes, parallel::ReduceOp::Max, "bench.max");
  const auto m = maxes.to_vector<double>();
  if (rank == 0) {
    const double mib = 1024.0 * 1024.0;
    std::printf("| model | ranks | dp x tp | SP | params+grads+AdamW per rank (MiB) | goal (MiB) "
                "| step peak above state (MiB) | tp bytes/step: blocks (analytic) | embedding/"
                "output, loss, norm weights | step (s) |\n");
    std::printf("| %s | %lld | %lld x %lld | %s | %.3f | %.3f | %.1f | %.2f MiB (%.2f) | %.2f, "
                "%.3f, %.3f MiB | %.3f |\n",
                o.model.c_str(), (long long)n, (long long)dp, (long long)o.tp,
                o.tp > 1 ? (o.sp ? "on" : "off") : "-", m[0] / mib, goal / mib, m[1] / mib,
                moved["blocks"] / mib, (o.tp > 1 ? analytic_blocks : 0.0) / mib,
                moved["embedding/output"] / mib, moved["loss"] / mib, moved["norm weights"] / mib,
                m[2]);
  }
  return 0;
}
