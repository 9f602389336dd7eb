// The CUDA backend's device plumbing (copies, multi-tensor copies, caching allocator) and its
// matmul and fused kernels (rms_norm, rope, swiglu, cross-entropy, AdamW, SGD, gradient clipping)
// against the CPU backend, forward and backward, on random inputs. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "runtime/core/allocator.h"
#include "runtime/core/deferred_errors.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/grad_mode.h"
#include "runtime/kernels/copy.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/rms_norm.h"
#include "runtime/ops/rope.h"
#include "runtime/ops/swiglu.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/optim/sgd.h"
#include "tests/runtime/grad_scale_check.h"
#include "tests/testing/errors.h"
#include "tests/testing/gpu.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::on_cuda;
using testing::randn_as;

double tol_for(DType t) { return t == DType::F64 ? 1e-12 : t == DType::F32 ? 2e-5 : 2e-2; }

// Runs `f` on CPU leaves and on CUDA copies of them, then backpropagates the same random output
// gradient on both; expects outputs and every input's gradient to agree within `tol`.
void expect_matches_cpu(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                        const std::vector<Tensor>& inputs, double tol, bool backward = true) {
  std::vector<Tensor> cpu, gpu;
  for (const Tensor& t : inputs) {
    const bool grad = backward && t.is_floating_point();
    cpu.push_back(t.detach().clone().set_requires_grad(grad));
    gpu.push_back(on_cuda(t.detach()).set_requires_grad(grad));
  }
  const Tensor out_c = f(cpu), out_g = f(gpu);
  ASSERT_TRUE(out_g.device().is_cuda());
  EXPECT_REL_NEAR(out_g, out_c, tol);
  if (!backward) return;
  const Tensor w = randn_as(out_c.shape(), out_c.dtype(), 99, "out_grad");
  out_c.backward(w);
  out_g.backward(on_cuda(w));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu[i].requires_grad()) continue;
    ASSERT_TRUE(gpu[i].grad().defined()) << "input " << i;
    EXPECT_TRUE(gpu[i].grad().device().is_cuda());
    EXPECT_REL_NEAR(gpu[i].grad(), cpu[i].grad(), tol) << "gradient of input " << i;
  }
}

TEST(CudaDevice, RoundTripsEveryDtypeBitwise) {
  MT_REQUIRE_CUDA();
  for (DType t :
       {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::Bool}) {
    const Tensor x = mul(randn_as({3, 37}, DType::F32, 1), 10.0).to(t);
    const Tensor back = on_cuda(x).to(Device::cpu());
    EXPECT_EQ(back.dtype(), t);
    EXPECT_TRUE(testing::all_close(back, x, 0, 0)) << dtype_name(t);
  }
}

TEST(CudaDevice, CopiesConvertAndFollowStrides) {
  MT_REQUIRE_CUDA();
  const Tensor x = randn_as({6, 9, 5}, DType::F32, 2);
  const Tensor g = on_cuda(x);
  // Transposed and sliced views copied on the device, with a dtype change.
  EXPECT_TRUE(
      testing::all_close(g.transpose(0, 2).contiguous(), x.transpose(0, 2).contiguous(), 0, 0));
  EXPECT_TRUE(testing::all_close(g.slice(1, 1, 8, 3).to(DType::BF16),
                                 x.slice(1, 1, 8, 3).to(DType::BF16), 0, 0));
  // copy_ across devices, broadcasting and casting.
  const Tensor dst =
      zeros({4, 5}, TensorOptions{}.with_device(Device::cuda()).with_dtype(DType::F64));
  dst.copy_(x.select(0, 0).select(0, 0));
  EXPECT_TRUE(
      testing::all_close(dst, x.select(0, 0).select(0, 0).to(DType::F64).expand({4, 5}), 0, 0));
  const Tensor f = full({3, 7}, 2.5, TensorOptions{}.with_device(Device::cuda()));
  EXPECT_EQ(f.to_vector<float>(), std::vector<float>(21, 2.5f));
  // Empty tensors move too.
  EXPECT_EQ(on_cuda(empty({0, 3})).to(Device::cpu()).shape(), (Shape{0, 3}));
}

// Transposed views copied to contiguous tensors take the tiled kernel: the same values as the CPU,
// for sizes that are and are not multiples of its tile, batched, sliced and with a dtype change;
// a view that is not a plain transpose takes the strided loop and is equally right.
TEST(CudaDevice, TransposedCopiesMatchTheCpu) {
  MT_REQUIRE_CUDA();
  for (const Shape& shape : {Shape{64, 96}, Shape{37, 1000}, Shape{2049, 33}, Shape{3, 45, 70},
                             Shape{1, 2, 32, 31}}) {
    SCOPED_TRACE(::testing::Message() << shape.size() << "-D, last dims " << shape[shape.size() - 2]
                                      << " x " << shape.back());
    const Tensor x = randn_as(shape, DType::F32, 9);
    const Tensor g = on_cuda(x);
    const int64_t d = int64_t(shape.size());
    EXPECT_TRUE(testing::all_close(g.transpose(d - 2, d - 1).contiguous(),
                                   x.transpose(d - 2, d - 1).contiguous(), 0, 0));
    EXPECT_TRUE(testing::all_close(g.to(DType::BF16).transpose(d - 2, d - 1).contiguous(),
                                   x.to(DType::BF16).transpose(d - 2, d - 1).contiguous(), 0, 0));
    const Tensor converted =
        empty(x.transpose(d - 2, d - 1).shape(), TensorOptions{}.with_device(Device::cuda())
                                                     .with_dtype(DType::BF16));
    converted.copy_(g.transpose(d - 2, d - 1));
    EXPECT_TRUE(testing::all_close(converted, x.transpose(d - 2, d - 1).to(DType::BF16), 0, 0));
  }
  const Tensor x = randn_as({40, 50}, DType::F32, 10);
  const Tensor g = on_cuda(x);
  EXPECT_TRUE(testing::all_close(g.slice(1, 1, 49).transpose(0, 1).contiguous(),
                                 x.slice(1, 1, 49).transpose(0, 1).contiguous(), 0, 0));
}

TEST(CudaDevice, CachingAllocatorReusesBlocksAndReportsOutOfMemory) {
  MT_REQUIRE_CUDA();
  const Device d = Device::cuda();
  { Tensor warm = empty({1 << 20}, TensorOptions{}.with_device(d)); }
  const MemoryStats before = memory_stats(d);
  for (int i = 0; i < 10; ++i) {
    Tensor t = empty({1 << 20}, TensorOptions{}.with_device(d));
    EXPECT_GE(memory_stats(d).bytes_in_use, before.bytes_in_use + (int64_t(4) << 20));
  }
  const MemoryStats after = memory_stats(d);
  EXPECT_EQ(after.bytes_reserved, before.bytes_reserved) << "a freed block was not reused";
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  const std::string err =
      testing::error_of([&] { (void)empty({int64_t(1) << 40}, TensorOptions{}.with_device(d)); });
  EXPECT_NE(err.find("CUDA out of memory"), std::string::npos) << err;
  EXPECT_NE(err.find("tried to allocate 4194304 MiB"), std::string::npos) << err;
  // The device still works after the failed allocation.
  EXPECT_EQ(full({2}, 1.0, TensorOptions{}.with_device(d)).to_vector<float>(),
            (std::vector<float>{1, 1}));
}

TEST(CudaMatmul, MatchesCpuForLayoutsBatchesAndDtypes) {
  MT_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::BF16, DType::F64}) {
    SCOPED_TRACE(dtype_name(t));
    const auto mm = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
    expect_matches_cpu(mm, {randn_as({37, 53}, t, 1), randn_as({53, 29}, t, 2)}, tol_for(t));
    // Transposed operands (views, no copies), a batch folded into rows, strided batches,
    // broadcast batches.
    expect_matches_cpu(
        [](const std::vector<Tensor>& in) { return matmul(in[0], in[1], true, true); },
        {randn_as({53, 37}, t, 3), randn_as({29, 53}, t, 4)}, tol_for(t));
    expect_matches_cpu([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); },
                       {randn_as({3, 17, 64}, t, 5), randn_as({40, 64}, t, 6)}, tol_for(t));
    expect_matches_cpu(mm, {randn_as({3, 17, 33}, t, 7), randn_as({3, 33, 9}, t, 8)}, tol_for(t));
    expect_matches_cpu(mm, {randn_as({2, 3, 5, 7}, t, 9), randn_as({3, 7, 4}, t, 10)}, tol_for(t));
    expect_matches_cpu(mm, {randn_as({2, 1, 5, 7}, t, 11), randn_as({1, 3, 7, 4}, t, 12)},
                       tol_for(t));
  }
  // K == 0 gives zeros; M == 0 gives an empty result.
  const Tensor z = matmul(on_cuda(empty({4, 0})), on_cuda(empty({0, 3})));
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(12, 0.0f));
  EXPECT_EQ(matmul(on_cuda(empty({0, 5})), on_cuda(empty({5, 3}))).shape(), (Shape{0, 3}));
}

TEST(CudaFusedKernels, RmsNormRopeSwiGluMatchCpu) {
  MT_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::BF16, DType::F64, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    expect_matches_cpu([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], 1e-5); },
                       {randn_as({5, 7, 67}, t, 1), randn_as({67}, t, 2)}, tol_for(t));
    expect_matches_cpu([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], 1e-5); },
                       {randn_as({300, 2048}, t, 3), randn_as({2048}, t, 4)}, tol_for(t));
    // Rows narrower than a warp (most of the block idle in the reductions), and more rows than
    // one dweight chunk (128) with a partial last chunk.
    expect_matches_cpu([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], 1e-6); },
                       {randn_as({259, 3}, t, 8), randn_as({3}, t, 9)}, tol_for(t));
    const RopeTables tables = rope_frequencies(16, 40, 10000.0);
    const Tensor cs = on_cuda(tables.cos), sn = on_cuda(tables.sin);
    expect_matches_cpu(
        [&](const std::vector<Tensor>& in) {
          const bool gpu = in[0].device().is_cuda();
          return apply_rope(in[0], gpu ? cs : tables.cos, gpu ? sn : tables.sin, 3);
        },
        {randn_as({2, 9, 3, 16}, t, 5)}, tol_for(t));
    // Read in place from the columns of a joined projection: tokens 3 * 16 + 24 elements apart
    // (16-byte aligned for 2-byte dtypes: packs), and 3 * 16 + 5 apart (element by element).
    for (const int64_t extra : {int64_t(24), int64_t(5)}) {
      expect_matches_cpu(
          [&](const std::vector<Tensor>& in) {
            const bool gpu = in[0].device().is_cuda();
            const Tensor x = in[0].narrow(2, extra, 3 * 16).view({2, 9, 3, 16});
            return apply_rope(x, gpu ? cs : tables.cos, gpu ? sn : tables.sin, 3);
          },
          {randn_as({2, 9, 3 * 16 + extra}, t, 10)}, tol_for(t));
    }
    expect_matches_cpu([](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); },
                       {randn_as({3, 11, 173}, t, 6), randn_as({3, 11, 173}, t, 7)}, tol_for(t));
  }
}

TEST(CudaFusedKernels, CrossEntropyMatchesCpuAndRejectsBadTargets) {
  MT_REQUIRE_CUDA();
  std::vector<int64_t> ids(65);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 7919 % 1000);
  ids[3] = ids[40] = -100;  // ignored
  const Tensor targets = from_vector<int64_t>(ids, {65}, {DType::I64});
  for (DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    expect_matches_cpu(
        [&](const std::vector<Tensor>& in) {
          return cross_entropy(in[0], in[0].device().is_cuda() ? on_cuda(targets) : targets);
        },
        {mul(randn_as({65, 1000}, DType::F32, 1), 3.0).to(t)}, t == DType::F32 ? 2e-5 : 2e-2);
  }
  // A bad target does not make the host wait: cross_entropy returns while the stream is held
  // (so its verdict cannot have arrived), and the next host read raises the error once, naming
  // the target and its position. Unheld, a fast GPU's verdict may arrive before the op returns,
  // and the op raises it then.
  ids[17] = 1000;
  const Tensor bad_x = on_cuda(randn_as({65, 1000}, DType::F32, 2));
  const Tensor bad_t = on_cuda(from_vector<int64_t>(ids, {65}, {DType::I64}));
  Tensor bad_loss;
  {
    testing::StreamBlocker hold(/*release_after_s=*/3);
    EXPECT_NO_THROW(bad_loss = cross_entropy(bad_x, bad_t));
  }
  const std::string err = testing::error_of([&] { (void)bad_loss.item<double>(); });
  EXPECT_NE(err.find("target 1000 at position [17]"), std::string::npos) << err;
  EXPECT_EQ(pending_verdicts(), 0);
  // A negative target that is not ignore_index is rejected too (the first bad position named,
  // here by synchronize()), and the device is still usable afterwards (an error, not a fault).
  ids[9] = -1;
  const Tensor x2 = on_cuda(randn_as({65, 1000}, DType::F32, 2)).set_requires_grad(true);
  const Tensor t2 = on_cuda(from_vector<int64_t>(ids, {65}, {DType::I32}));
  const std::string err2 = testing::error_of([&] {
    cross_entropy(x2, t2, -100, Reduction::Sum).backward();  // bad rows are skipped, not read
    synchronize(x2.device());
  });
  EXPECT_NE(err2.find("target -1 at position [9]"), std::string::npos) << err2;
  EXPECT_NO_THROW(synchronize(x2.device()));  // raised once
  ids[9] = ids[17] = 5;
  const Tensor ok = cross_entropy(on_cuda(randn_as({65, 1000}, DType::F32, 2)),
                                  on_cuda(from_vector<int64_t>(ids, {65}, {DType::I64})));
  EXPECT_TRUE(std::isfinite(ok.item<double>()));
}

// Llama 3's vocabulary (rows much longer than the 512-thread block), i32 targets, leading dims,
// every reduction; then a batch with no valid target: mean 0 and a zero gradient, as on the CPU.
TEST(CudaFusedKernels, CrossEntropyLargeVocabReductionsAndAllIgnored) {
  MT_REQUIRE_CUDA();
  const int64_t V = 128256;
  const Tensor targets =
      from_vector<int32_t>({5, int32_t(V - 1), -100, 0, 77777, 3}, {2, 3}, {DType::I32});
  for (DType t : {DType::F32, DType::BF16}) {
    for (Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " reduction " << int(r));
      expect_matches_cpu(
          [&](const std::vector<Tensor>& in) {
            return cross_entropy(in[0], in[0].device().is_cuda() ? on_cuda(targets) : targets,
                                 -100, r);
          },
          {mul(randn_as({2, 3, V}, DType::F32, 21), 4.0).to(t)}, t == DType::F32 ? 2e-5 : 2e-2);
    }
  }
  const Tensor ignored = from_vector<int64_t>({7, 7, 7}, {3}, {DType::I64});
  expect_matches_cpu(
      [&](const std::vector<Tensor>& in) {
        return cross_entropy(in[0], in[0].device().is_cuda() ? on_cuda(ignored) : ignored, 7);
      },
      {randn_as({3, 50}, DType::F32, 22)}, 2e-5);
  const Tensor x = on_cuda(randn_as({3, 50}, DType::F32, 22)).set_requires_grad(true);
  const Tensor loss = cross_entropy(x, on_cuda(ignored), 7);
  EXPECT_EQ(loss.item<double>(), 0.0);
  loss.backward();
  EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>(150, 0.0f));
}

TEST(CudaOptimizers, AdamWAndSgdStepsMatchCpu) {
  MT_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    for (int which = 0; which < 3; ++which) {
      const Tensor p0 = randn_as({33, 65}, t, 1);
      const Tensor pc = p0.clone().set_requires_grad(true);
      const Tensor pg = on_cuda(p0).set_requires_grad(true);
      std::unique_ptr<optim::Optimizer> oc, og;
      if (which == 0) {
        optim::AdamWOptions o{.lr = 1e-2, .weight_decay = 0.1};
        oc = std::make_unique<optim::AdamW>(std::vector<Tensor>{pc}, o);
        og = std::make_unique<optim::AdamW>(std::vector<Tensor>{pg}, o);
      } else {
        // which == 2: no momentum (the kernel gets no buffer).
        optim::SGDOptions o{.lr = 1e-2, .momentum = which == 1 ? 0.9 : 0.0, .weight_decay = 0.1,
                            .nesterov = which == 1};
        oc = std::make_unique<optim::SGD>(std::vector<Tensor>{pc}, o);
        og = std::make_unique<optim::SGD>(std::vector<Tensor>{pg}, o);
      }
      for (int step = 0; step < 3; ++step) {
        const Tensor g = randn_as({33, 65}, t, 10 + step);
        pc.set_grad(g);
        pg.set_grad(on_cuda(g));
        oc->step();
        og->step();
      }
      EXPECT_REL_NEAR(pg, pc, t == DType::F32 ? 1e-6 : 1e-2) << (which == 0 ? "AdamW" : "SGD")
                                                             << which;
    }
  }
}

// AdamW on CUDA updates many parameters per launch (48 per table): 60 parameters of varied sizes
// (empty, one element, several blocks), two of which skip a step (so step counts differ within
// one launch), against the CPU's per-parameter kernel. f64's table (about 5 KB) is past the
// classic 4 KB kernel-parameter limit; bf16 parameters keep f32 state.
TEST(CudaOptimizers, MultiTensorAdamWMatchesCpuPerParameter) {
  MT_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::F64, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<int64_t> sizes = {0, 1, 7, 1024, 1025, 5000, 40000};
    std::vector<Tensor> cpu, gpu;
    for (int i = 0; i < 60; ++i) {
      const Tensor p0 = randn_as({sizes[size_t(i) % sizes.size()]}, t, 100 + uint64_t(i));
      cpu.push_back(p0.clone().set_requires_grad(true));
      gpu.push_back(on_cuda(p0).set_requires_grad(true));
    }
    optim::AdamWOptions o{.lr = 1e-2, .weight_decay = 0.1};
    optim::AdamW oc(cpu, o), og(gpu, o);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < cpu.size(); ++i) {
        const bool skip = step == 1 && (i == 3 || i == 50);
        const Tensor g = randn_as(cpu[i].shape(), t, 1000 * uint64_t(step) + i);
        cpu[i].set_grad(skip ? Tensor() : g);
        gpu[i].set_grad(skip ? Tensor() : on_cuda(g));
      }
      oc.step();
      og.step();
    }
    const double tol = t == DType::F64 ? 1e-12 : t == DType::F32 ? 1e-6 : 1e-2;
    for (size_t i = 0; i < cpu.size(); ++i) {
      if (cpu[i].numel() == 0) continue;
      EXPECT_REL_NEAR(gpu[i], cpu[i], tol) << "parameter " << i;
    }
  }
}


// Clipping on CUDA reduces and scales every gradient of a device in a few multi-tensor launches:
// 61 gradients of mixed dtypes and sizes (51 f32: two 48-tensor tables; several blocks each),
// one of them a view that is not 16-byte aligned (the unpacked path), against the CPU's
// tensor-by-tensor ops. Norms agree to f64 rounding and propagate NaN; with the same total the
// scaled gradients are bitwise the CPU's.
TEST(CudaClipGrad, MultiTensorNormAndScaleMatchCpu) {
  MT_REQUIRE_CUDA();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const std::vector<int64_t> sizes = {0, 1, 7, 1024, 1025, 5000, 40000, 70001};
  std::vector<Tensor> cpu, gpu;
  for (int i = 0; i < 60; ++i) {
    const Shape shape{sizes[size_t(i) % sizes.size()]};
    const DType t = i < 50 ? DType::F32 : i % 2 == 0 ? DType::BF16 : DType::F64;
    const Tensor g = randn_as(shape, t, 300 + uint64_t(i));
    cpu.push_back(zeros(shape, TensorOptions{}.with_dtype(t)));
    gpu.push_back(on_cuda(cpu.back()));
    cpu.back().set_grad(g.clone());
    gpu.back().set_grad(on_cuda(g));
  }
  const Tensor odd = randn_as({4097}, DType::F32, 999);  // its view from element 1 is misaligned
  cpu.push_back(zeros({4096}));
  gpu.push_back(on_cuda(cpu.back()));
  cpu.back().set_grad(odd.narrow(0, 1, 4096).clone());
  gpu.back().set_grad(on_cuda(odd).narrow(0, 1, 4096));
  ASSERT_NE(reinterpret_cast<uintptr_t>(gpu.back().grad().data_ptr()) % 16, 0u);

  for (double p : {2.0, 1.0, 3.0, kInf}) {
    SCOPED_TRACE(p);
    const Tensor norm_g = optim::local_norm_pow_tensor(gpu, p);
    EXPECT_TRUE(norm_g.device().is_cuda());
    const double want = optim::local_norm_pow(cpu, p);
    EXPECT_NEAR(norm_g.item<double>(), want, 1e-12 * want);
  }
  const Tensor total_c = optim::norm_from_pow(optim::local_norm_pow_tensor(cpu, 2.0), 2.0);
  optim::clip_grads_with_norm_(cpu, 1.0, total_c);
  optim::clip_grads_with_norm_(gpu, 1.0, on_cuda(total_c));
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i].numel() == 0) continue;
    EXPECT_TRUE(testing::all_close(gpu[i].grad(), cpu[i].grad(), 0, 0)) << "gradient " << i;
  }
  {
    NoGradGuard no_grad;
    gpu[5].grad().narrow(0, 3, 1).fill_(NAN);
  }
  for (double p : {2.0, kInf})
    EXPECT_TRUE(std::isnan(optim::local_norm_pow_tensor(gpu, p).item<double>())) << p;
}

// Clipping folded into the update: the multi-tensor AdamW kernel scales as it reads.
TEST(CudaOptimizers, GradScaleEqualsClippingFirstBitwise) {
  MT_REQUIRE_CUDA();
  optim::expect_grad_scale_equals_clipping_first(Device::cuda(0));
}

// FSDP's casts of a block's parameters and gradients on one GPU go through copy_multi_tensor_:
// 53 pairs of four dtype pairs (f32 -> bf16: two 48-pair tables), sizes from empty to several
// blocks, one source view that is not 16-byte aligned; bitwise against copy_kernel pair by pair.
TEST(CudaDevice, MultiTensorCopyEqualsPairByPair) {
  MT_REQUIRE_CUDA();
  const std::vector<int64_t> sizes = {0, 1, 7, 1024, 1025, 9000, 40001};
  std::vector<Tensor> srcs, fused, single;
  for (int i = 0; i < 52; ++i) {
    const DType from = i < 50 ? DType::F32 : DType::BF16;
    const DType to = i < 50 ? DType::BF16 : i % 2 == 0 ? DType::F32 : DType::F64;
    const Tensor src = on_cuda(randn_as({sizes[size_t(i) % sizes.size()]}, from, 500 + i));
    srcs.push_back(src);
    fused.push_back(Tensor::empty(src.shape(), src.options().with_dtype(to)));
    single.push_back(Tensor::empty(src.shape(), src.options().with_dtype(to)));
  }
  const Tensor odd = on_cuda(randn_as({4097}, DType::F32, 999)).narrow(0, 1, 4096);
  ASSERT_NE(reinterpret_cast<uintptr_t>(odd.data_ptr()) % 16, 0u);
  srcs.push_back(odd);
  fused.push_back(Tensor::empty({4096}, odd.options().with_dtype(DType::BF16)));
  single.push_back(Tensor::empty({4096}, odd.options().with_dtype(DType::BF16)));
  copy_multi_tensor_kernel(srcs.front().device(), srcs, fused);
  for (size_t k = 0; k < srcs.size(); ++k) copy_kernel(srcs[k].device(), srcs[k], single[k]);
  for (size_t k = 0; k < srcs.size(); ++k)
    EXPECT_TRUE(testing::all_close(fused[k], single[k], 0, 0)) << "pair " << k;
  const std::string msg = testing::error_of([&] {  // 1024 elements into 1025
    copy_multi_tensor_kernel(srcs[3].device(), std::vector{srcs[3]}, std::vector{fused[4]});
  });
  EXPECT_NE(msg.find("expected contiguous floating tensors of one size"), std::string::npos) << msg;
}

}  // namespace
}  // namespace mt::runtime
