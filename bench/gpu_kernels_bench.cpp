// GPU kernel table: the CUDA backend's kernels at Llama 3 1B training shapes (batch 4 x seq 2048,
// dim 2048, hidden 8192, 32 query / 8 kv heads of 64, vocab 128,256), each against the ceiling
// that bounds it, both measured in the same run: device-to-device copy bandwidth (bytes read +
// written) for the memory-bound kernels, a large bf16 matmul's TFLOP/s for the compute-bound
// ones. Prints one row per kernel: median time, achieved TB/s or TFLOP/s, and % of the ceiling.
// Bytes are the fewest the kernel must move (each input read once, each output written once);
// FLOPs are the usual 2 m n k (attention: 4 B H T^2 D, halved for causal; backward 2.5x).
// Also MoE grouped_mm, DLRM table-batched embedding bags (the ids start on the host, as from a
// data loader, so those rows include their copy, the host id check and, with the backward, the
// host grouping by row), and AdamW and FSDP's one-rank casts over the 1B's own 146 tensors.
//
// Float8 GEMMs and casts at the 1B and 8B layers' shapes, and float8 MoE experts (fwd+bwd),
// against bf16 (issue 32); --float8-only measures the ceilings and those rows alone.
//
//   ./build/bench/gpu_kernels_bench [--reps N] [--float8-only]   (on the GPU machine: .device/bin/)
//
// Runs through the runtime's public ops (what training calls), synchronising the device once
// per timed batch of repetitions. Without a CUDA device it says so and exits 0.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "runtime/autograd/engine.h"
#include "runtime/core/determinism.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/grad_mode.h"
#include "runtime/kernels/copy.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/embedding.h"
#include "runtime/ops/embedding_bag.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/float8.h"
#include "runtime/ops/float8_grouped.h"
#include "runtime/ops/grouped_matmul.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/join.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/rms_norm.h"
#include "runtime/ops/rope.h"
#include "runtime/ops/swiglu.h"
#include "runtime/optim/adamw.h"

namespace mt::runtime {
namespace {

using Clock = std::chrono::steady_clock;

int g_reps = 20;
bool g_float8_only = false;

// Median seconds per call of fn over g_reps timed calls (after 3 warm-ups), one device sync per
// call so each sample is the call's own time.
double time_it(Device device, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  synchronize(device);
  std::vector<double> samples;
  for (int i = 0; i < g_reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    synchronize(device);
    samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

Tensor rnd(const Shape& shape, DType dtype, Device device, const char* name) {
  return randn(shape, RandomKey(7, name)).to(dtype).to(device);
}

// Uniform integer ids in [0, n) on `device`.
Tensor random_ids(int64_t count, int64_t n, Device device, const char* name) {
  return mul(rand({count}, RandomKey(8, name)), double(n)).to(DType::I64).to(device);
}

// The MoE rows' experts (DeepSeek-V3-like, scaled down): 8192 tokens x top 8 over 64 experts,
// dim 2048 -> expert hidden 1408.
constexpr int64_t kMoeExperts = 64, kMoeTopK = 8, kMoeHidden = 1408;

// rows_total routed rows over `experts`, unevenly: from 0.25x to 1.75x the mean per expert.
std::vector<int64_t> uneven_expert_counts(int64_t experts, int64_t rows_total) {
  std::vector<int64_t> counts(static_cast<size_t>(experts));
  int64_t assigned = 0;
  for (int64_t e = 0; e < experts; ++e) {
    counts[size_t(e)] = rows_total / experts * (1 + 6 * e / (experts - 1)) / 4;
    assigned += counts[size_t(e)];
  }
  counts.back() += rows_total - assigned;
  return counts;
}

struct Row {
  std::string kernel, shape;
  double seconds, amount;  // amount: bytes (memory-bound) or FLOPs (compute-bound)
  bool flops;
};

void print(const std::vector<Row>& rows, double tb_per_s, double tflop_per_s) {
  std::printf("\n%-34s %-30s %10s %12s %8s\n", "kernel", "shape", "time (us)", "achieved",
              "% ceil");
  for (const Row& r : rows) {
    const double rate = r.amount / r.seconds / 1e12;
    const double ceiling = r.flops ? tflop_per_s : tb_per_s;
    std::printf("%-34s %-30s %10.1f %8.2f %s %7.1f%%\n", r.kernel.c_str(), r.shape.c_str(),
                r.seconds * 1e6, rate, r.flops ? "TF/s" : "TB/s", 100.0 * rate / ceiling);
  }
  std::printf("\nceilings measured in this run: copy %.2f TB/s (read + write), bf16 matmul %.1f "
              "TFLOP/s\n", tb_per_s, tflop_per_s);
}

// Float8 (issue 32) at the Llama 3 1B and 8B layers' shapes (8192 tokens): the FP8 GEMM on
// operands cast beforehand against the bf16 linear of the same shape (FLOPs 2 m n k, against the
// bf16 ceiling: FP8's tensor-core peak is twice it), the cast of a bf16 activation to codes in
// both layouts (bytes: read once, two codes written; the kernels read it twice, amax then cast),
// and a whole layer forward + backward in float8 against bf16 (3 GEMMs each).
void float8_rows(Device dev, std::vector<Row>& rows) {
  if (auto why = float8_gemm_unsupported_kernel(dev)) {
    std::printf("float8 rows skipped: %s\n", why->c_str());
    return;
  }
  const DType bf16 = DType::BF16;
  const int64_t n = 8192;
  struct Shape3 {
    const char* name;
    int64_t in, out;
  };
  for (const Shape3& s : {Shape3{"1B ffn up", 2048, 8192}, Shape3{"1B ffn down", 8192, 2048},
                          Shape3{"1B attn out", 2048, 2048}, Shape3{"8B ffn up", 4096, 14336},
                          Shape3{"8B ffn down", 14336, 4096}, Shape3{"8B attn out", 4096, 4096},
                          Shape3{"8B kv proj", 4096, 1024}}) {
    NoGradGuard no_grad;
    const std::string shape =
        std::to_string(n) + "x" + std::to_string(s.in) + " -> " + std::to_string(s.out);
    const double flops = 2.0 * n * s.in * s.out;
    Tensor x = rnd({n, s.in}, bf16, dev, "f8x"), w = rnd({s.out, s.in}, bf16, dev, "f8w");
    rows.push_back({std::string("bf16 linear (") + s.name + ")", shape,
                    time_it(dev, [&] { linear(x, w); }), flops, true});
    const Float8Tensor xq = to_float8(x, Float8Format::E4M3, true, false);
    const Float8Tensor wq = to_float8(w, Float8Format::E4M3, true, false);
    rows.push_back({std::string("fp8 gemm (") + s.name + ")", shape, time_it(dev, [&] {
                      float8_mm(xq.codes, xq.format, xq.scale_inv, wq.codes, wq.format,
                                wq.scale_inv, bf16, true);
                    }),
                    flops, true});
  }
  {
    NoGradGuard no_grad;
    Tensor x = rnd({n, 4096}, bf16, dev, "f8cast");
    rows.push_back({"float8 cast, both layouts", "8192x4096 bf16 -> e4m3", time_it(dev, [&] {
                      to_float8(x, Float8Format::E4M3, true, true);
                    }),
                    double(n) * 4096 * (2 + 1 + 1), false});
  }
  EnableGradGuard grad_on;
  Tensor x = rnd({n, 2048}, bf16, dev, "f8lx").set_requires_grad(true);
  Tensor w = rnd({8192, 2048}, bf16, dev, "f8lw").set_requires_grad(true);
  const double layer_flops = 3 * 2.0 * n * 2048 * 8192;
  rows.push_back({"bf16 linear fwd+bwd (1B ffn up)", "8192x2048 -> 8192", time_it(dev, [&] {
                    sum(linear(x, w)).backward();
                  }),
                  layer_flops, true});
  rows.push_back({"float8_linear fwd+bwd (1B ffn up)", "8192x2048 -> 8192", time_it(dev, [&] {
                    sum(float8_linear(x, w)).backward();
                  }),
                  layer_flops, true});
  // MoE experts' up projection at the grouped_mm row's shape, forward + backward (3 grouped
  // GEMMs each): bf16 against FP8 with per-row scales (float8_grouped_mm), the routed experts'
  // float8 ([quantize.grouped_mm.float8]) at a size where FP8 might pay.
  const int64_t rows_total = n * kMoeTopK;
  const std::vector<int64_t> counts = uneven_expert_counts(kMoeExperts, rows_total);
  Tensor xs = rnd({rows_total, 2048}, bf16, dev, "f8xs").set_requires_grad(true);
  Tensor we = rnd({kMoeExperts, kMoeHidden, 2048}, bf16, dev, "f8we").set_requires_grad(true);
  const double experts_flops = 3 * 2.0 * rows_total * 2048 * kMoeHidden;
  const std::string experts_shape = "65536x2048 -> 64 x 1408";
  rows.push_back({"grouped_mm fwd+bwd (64 experts)", experts_shape, time_it(dev, [&] {
                    sum(grouped_mm(xs, we, counts)).backward();
                  }),
                  experts_flops, true});
  rows.push_back({"float8_grouped_mm fwd+bwd", experts_shape, time_it(dev, [&] {
                    sum(float8_grouped_mm(xs, we, counts)).backward();
                  }),
                  experts_flops, true});
}

int run() {
  if (cuda_device_count() == 0) {
    std::printf("gpu_kernels_bench: no CUDA device (%s); nothing to measure\n",
                cuda_backend_built() ? "none visible" : "this build has no CUDA backend");
    return 0;
  }
  const Device dev = Device::cuda(0);
  std::printf("%s, %d repetitions per kernel (median)\n", device_description(dev).c_str(), g_reps);
  const DType bf16 = DType::BF16, f32 = DType::F32;
  const int64_t B = 4, T = 2048, N = B * T, D = 2048, H = 8192, V = 128256, Hq = 32, Hkv = 8,
                hd = 64;
  std::vector<Row> rows;

  // Ceilings.
  const int64_t copy_elems = int64_t(1) << 28;  // 1 GiB of f32
  Tensor src = rnd({copy_elems}, f32, dev, "copy_src"), dst = empty({copy_elems}, src.options());
  const double copy_s = time_it(dev, [&] { dst.copy_(src); });
  const double tb_per_s = 2.0 * 4 * double(copy_elems) / copy_s / 1e12;
  src = dst = Tensor();
  const int64_t M = 8192;
  Tensor a = rnd({M, M}, bf16, dev, "a"), b = rnd({M, M}, bf16, dev, "b");
  const double mm_s = time_it(dev, [&] { matmul(a, b); });
  const double tflop_per_s = 2.0 * double(M) * M * M / mm_s / 1e12;
  rows.push_back({"matmul bf16 (ceiling)", "8192^3", mm_s, 2.0 * M * M * M, true});
  a = b = Tensor();
  if (g_float8_only) {
    float8_rows(dev, rows);
    print(rows, tb_per_s, tflop_per_s);
    return 0;
  }

  NoGradGuard no_grad_outer;
  // Matmuls of the block.
  {
    Tensor x = rnd({N, D}, bf16, dev, "x"), w1 = rnd({H, D}, bf16, dev, "w1");
    Tensor wo = rnd({D, D}, bf16, dev, "wo"), wkv = rnd({Hkv * hd, D}, bf16, dev, "wkv");
    Tensor h = rnd({N, H}, bf16, dev, "h"), w2 = rnd({D, H}, bf16, dev, "w2");
    rows.push_back({"linear x@w1^T (ffn up)", "8192x2048 -> 8192", time_it(dev, [&] { linear(x, w1); }),
                    2.0 * N * D * H, true});
    rows.push_back({"linear h@w2^T (ffn down)", "8192x8192 -> 2048", time_it(dev, [&] { linear(h, w2); }),
                    2.0 * N * H * D, true});
    rows.push_back({"linear x@wo^T (attn out)", "8192x2048 -> 2048", time_it(dev, [&] { linear(x, wo); }),
                    2.0 * N * D * D, true});
    rows.push_back({"linear x@wk^T (kv proj)", "8192x2048 -> 512", time_it(dev, [&] { linear(x, wkv); }),
                    2.0 * N * D * Hkv * hd, true});
    // The attention's q, k and v projections as three GEMMs, and joined as the model runs them
    // (the weights concatenated, one GEMM, split into views).
    const double qkv_flops = 2.0 * N * D * (D + 2 * Hkv * hd);
    rows.push_back({"q, k, v projections: 3 GEMMs", "8192x2048 -> 2048+512+512",
                    time_it(dev, [&] { linear(x, wo), linear(x, wkv), linear(x, wkv); }),
                    qkv_flops, true});
    rows.push_back({"q, k, v projections: joined", "8192x2048 -> 3072", time_it(dev, [&] {
                      split(linear(x, cat({wo, wkv, wkv}, 0)), {D, Hkv * hd, Hkv * hd}, -1);
                    }),
                    qkv_flops, true});
  }
  float8_rows(dev, rows);
  // Memory-bound fused kernels, bf16 activations.
  {
    Tensor x = rnd({N, D}, bf16, dev, "x"), w = rnd({D}, bf16, dev, "w");
    rows.push_back({"rms_norm fwd", "8192x2048 bf16", time_it(dev, [&] { rms_norm(x, w); }),
                    2.0 * 2 * N * D, false});
    Tensor g = rnd({N, H}, bf16, dev, "g"), u = rnd({N, H}, bf16, dev, "u");
    rows.push_back({"swiglu fwd", "8192x8192 bf16", time_it(dev, [&] { swiglu(g, u); }),
                    3.0 * 2 * N * H, false});
    const RopeTables tables = rope_frequencies(hd, T);
    const Tensor cos = tables.cos.to(dev), sin = tables.sin.to(dev);
    Tensor q = rnd({B, T, Hq, hd}, bf16, dev, "q");
    rows.push_back({"rope fwd (q)", "4x2048x32x64 bf16", time_it(dev, [&] { apply_rope(q, cos, sin); }),
                    2.0 * 2 * q.numel(), false});
    Tensor ids = random_ids(N, V, dev, "ids");
    Tensor table = rnd({V, D}, bf16, dev, "table");
    rows.push_back({"embedding fwd", "8192 rows of 128256x2048", time_it(dev, [&] { embedding(table, ids); }),
                    2.0 * 2 * N * D, false});
  }
  // Forward + backward pairs (autograd on).
  {
    GradMode::set_enabled(true);
    Tensor x = rnd({N, D}, bf16, dev, "x").set_requires_grad(true);
    Tensor w = rnd({D}, bf16, dev, "w").set_requires_grad(true);
    Tensor dy = rnd({N, D}, bf16, dev, "dy");
    rows.push_back({"rms_norm fwd+bwd", "8192x2048 bf16", time_it(dev, [&] {
                      autograd::backward({rms_norm(x, w)}, {dy});
                    }),
                    (2.0 + 3.0) * 2 * N * D, false});
    Tensor logits = rnd({N, V}, f32, dev, "logits").set_requires_grad(true);
    Tensor targets = random_ids(N, V, dev, "targets");
    rows.push_back({"cross_entropy fwd+bwd", "8192x128256 f32", time_it(dev, [&] {
                      autograd::backward({cross_entropy(logits, targets)});
                    }),
                    3.0 * 4 * N * V, false});
    logits = rnd({N, V}, bf16, dev, "logits16").set_requires_grad(true);  // llama's loss input
    rows.push_back({"cross_entropy fwd+bwd", "8192x128256 bf16", time_it(dev, [&] {
                      autograd::backward({cross_entropy(logits, targets, -100, Reduction::Mean,
                                                        DType::F32)});
                    }),
                    3.0 * 2 * N * V, false});
    logits = Tensor();
    // As the model passes them: transposed views of [B, T, H, D] activations.
    Tensor q_bthd = rnd({B, T, Hq, hd}, bf16, dev, "q").set_requires_grad(true);
    Tensor k_bthd = rnd({B, T, Hkv, hd}, bf16, dev, "k").set_requires_grad(true);
    Tensor v_bthd = rnd({B, T, Hkv, hd}, bf16, dev, "v").set_requires_grad(true);
    // The transposes are made in each call: a backward frees the graph it ran through.
    const auto attention = [&] {
      return scaled_dot_product_attention(q_bthd.transpose(1, 2), k_bthd.transpose(1, 2),
                                          v_bthd.transpose(1, 2), true);
    };
    const double attn_flops = 4.0 * B * Hq * double(T) * T * hd / 2;  // causal
    {
      NoGradGuard no_grad;
      rows.push_back({"attention fwd (cuDNN, causal GQA)", "4x32x2048x64 bf16 BTHD",
                      time_it(dev, [&] { attention(); }), attn_flops, true});
    }
    Tensor dout = rnd({B, T, Hq, hd}, bf16, dev, "dout").transpose(1, 2);
    for (bool deterministic : {true, false}) {  // training's default: [training] deterministic
      DeterministicAlgorithmsGuard mode(deterministic);
      rows.push_back({deterministic ? "attention fwd+bwd (deterministic)"
                                    : "attention fwd+bwd (non-deterministic)",
                      "4x32x2048x64 bf16 BTHD", time_it(dev, [&] {
                        autograd::backward({attention()}, {dout});
                      }),
                      3.5 * attn_flops, true});
    }
    GradMode::set_enabled(false);
  }
  // MoE experts (kMoeExperts), routed unevenly.
  {
    const int64_t E = kMoeExperts, rows_total = N * kMoeTopK, I = kMoeHidden;
    const std::vector<int64_t> counts = uneven_expert_counts(E, rows_total);
    Tensor xs = rnd({rows_total, D}, bf16, dev, "xs"), we = rnd({E, I, D}, bf16, dev, "we");
    rows.push_back({"grouped_mm x@w_e^T (64 experts)", "65536x2048 -> 1408", time_it(dev, [&] {
                      grouped_mm(xs, we, counts);
                    }),
                    2.0 * rows_total * D * I, true});
  }
  // Table-batched embedding bags (DLRM): 26 f32 tables of 1M x 128, batch 8192, 20 ids per bag;
  // bytes = the rows read plus the pooled output written.
  {
    const int64_t Tn = 26, rows_per = 1 << 20, dim = 128, batch = 8192, per_bag = 20;
    std::vector<Tensor> tables;
    TableBatchLayout layout;
    for (int64_t t = 0; t < Tn; ++t) {
      tables.push_back(rnd({rows_per, dim}, f32, dev, "tbe_table"));
      layout.feature_table.push_back(t);
    }
    const int64_t n = Tn * batch * per_bag;
    const Tensor values = random_ids(n, rows_per, Device::cpu(), "tbe_ids");
    std::vector<int64_t> bag_starts(size_t(Tn * batch + 1));
    for (size_t i = 0; i < bag_starts.size(); ++i) bag_starts[i] = int64_t(i) * per_bag;
    const Tensor offsets = from_vector<int64_t>(bag_starts, {Tn * batch + 1},
                                                TensorOptions{}.with_dtype(DType::I64));
    rows.push_back({"embedding_bags_batched fwd", "26 x 1Mx128 f32, 8192 x 20 ids",
                    time_it(dev, [&] {
                      embedding_bags_batched(tables, values, offsets, batch, layout);
                    }),
                    4.0 * double(n) * dim + 4.0 * batch * Tn * dim, false});
    // With the backward into a sink (as the fused row optimizers take it): the ids are grouped
    // by row on the host, the summed gradient rows written on the device. Bytes: the forward's
    // twice (the backward reads each id's row of the output gradient and writes at most one
    // summed row per id: an upper bound, repeated ids write fewer).
    const Tensor up = rnd({batch, Tn * dim}, f32, dev, "tbe_up");
    const TableGradSink sink = [](std::vector<RowSparseGrad>&) {};
    EnableGradGuard grad_on;  // the op records its backward only with grad mode on
    rows.push_back({"embedding_bags_batched fwd+bwd", "as above, row-sparse grads to a sink",
                    time_it(dev, [&] {
                      const Tensor out =
                          embedding_bags_batched(tables, values, offsets, batch, layout, {}, sink);
                      autograd::backward({out}, {up});
                    }),
                    2.0 * (4.0 * double(n) * dim + 4.0 * batch * Tn * dim), false});
  }
  // AdamW over f32 parameters: reads param, grad, m, v; writes param, m, v. First 16 tensors of
  // 64M (1.07e9 parameters), then the 146 tensors of the Llama 3 1B that training updates (its
  // shapes; 1.24e9 parameters), without and with a clipping scale read from the device.
  const auto adamw_rows = [&](const std::vector<Shape>& shapes, const std::string& name,
                              const std::string& what, bool with_scale_too) {
    std::vector<Tensor> params;
    double numel = 0;
    for (const Shape& shape : shapes) {
      Tensor p = rnd(shape, f32, dev, "p");
      p.set_requires_grad(true);
      p.set_grad(rnd(shape, f32, dev, "grad"));
      numel += double(p.numel());
      params.push_back(p);
    }
    optim::AdamW opt(params, {.lr = 1e-4});
    rows.push_back({name, what, time_it(dev, [&] { opt.step(); }), 7.0 * 4 * numel, false});
    if (!with_scale_too) return;
    const Tensor scale =
        scalar_tensor(0.5, TensorOptions{}.with_dtype(DType::F64).with_device(dev));
    rows.push_back({name + ", clip scale", what, time_it(dev, [&] { opt.step(scale); }),
                    7.0 * 4 * numel, false});
  };
  adamw_rows(std::vector<Shape>(16, Shape{int64_t(1) << 26}), "AdamW step (16 x 64M f32)",
             "1.07e9 params", false);
  {
    const int64_t dim = 2048, kv = 512, ffn = 8192, vocab = 128256, layers = 16;
    std::vector<Shape> llama{{vocab, dim}};  // tied embedding and output
    for (int64_t l = 0; l < layers; ++l) {
      for (Shape s : {Shape{dim, dim}, Shape{kv, dim}, Shape{kv, dim}, Shape{dim, dim},
                      Shape{ffn, dim}, Shape{dim, ffn}, Shape{ffn, dim}, Shape{dim}, Shape{dim}})
        llama.push_back(s);
    }
    llama.push_back({dim});  // the final norm
    adamw_rows(llama, "AdamW step (Llama 3 1B's tensors)", "146 tensors, 1.24e9", true);
    // FSDP's one-rank cast of the same tensors, f32 shards into bf16 (once a step; the gradients
    // go back the other way): one launch per tensor against the multi-tensor copy.
    std::vector<Tensor> shards, casts;
    double numel = 0;
    for (const Shape& shape : llama) {
      shards.push_back(rnd(shape, f32, dev, "shard"));
      casts.push_back(empty(shape, TensorOptions{}.with_dtype(bf16).with_device(dev)));
      numel += double(shards.back().numel());
    }
    rows.push_back({"f32->bf16 casts, per tensor", "146 tensors, 1.24e9", time_it(dev, [&] {
                      for (size_t k = 0; k < shards.size(); ++k)
                        copy_kernel(dev, shards[k], casts[k]);
                    }),
                    6.0 * numel, false});
    rows.push_back({"f32->bf16 casts, multi-tensor", "146 tensors, 1.24e9",
                    time_it(dev, [&] { copy_multi_tensor_kernel(dev, shards, casts); }),
                    6.0 * numel, false});
  }
  print(rows, tb_per_s, tflop_per_s);
  return 0;
}

}  // namespace
}  // namespace mt::runtime

int main(int argc, char** argv) {
  int kept = 1;  // --float8-only is ours; the rest is bench_args' --reps
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--float8-only") == 0) {
      mt::runtime::g_float8_only = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  mt::runtime::g_reps = mt::bench::parse_reps(argc, argv, mt::runtime::g_reps);
  if (mt::runtime::g_reps < 0) return 2;
  try {
    return mt::runtime::run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_kernels_bench: %s\n", e.what());
    return 1;
  }
}
