// CUDA grouped_mm and grouped_mm_tn against the CPU backend (both weight layouts, f32/bf16/f64,
// empty groups, forward and gradients), and a tiny MoE model (router, grouped experts, shared
// expert) whose logits and parameter gradients on the GPU match the CPU's; the dense matmul's
// rarer cuBLASLt layouts and the caching allocator's accounting of reused blocks. Skips without a
// GPU.
#include <gtest/gtest.h>

#include <vector>

#include "models/moe/model.h"
#include "runtime/core/allocator.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/grouped_matmul.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/gpu_compare.h"

namespace mt::runtime::gpu_test {
namespace {

class GroupedMmGpu : public GpuTest {};

const std::vector<int64_t> kCounts{9, 0, 17, 1, 0, 37};  // 64 rows, two empty groups

TEST_F(GroupedMmGpu, ForwardAndGradientsMatchCpuBothLayouts) {
  for (DType t : {DType::F32, DType::BF16, DType::F64}) {
    const auto [atol, rtol] = tol(t);
    for (bool transpose_w : {true, false}) {
      SCOPED_TRACE(::testing::Message() << t << (transpose_w ? " w [G, M, K]" : " w [G, K, M]"));
      const Tensor x = rnd({64, 24}, t, 1);
      const Tensor w = transpose_w ? rnd({6, 40, 24}, t, 2) : rnd({6, 24, 40}, t, 3);
      // The backward of grouped_mm runs grouped_mm (input gradient) and grouped_mm_tn (weight
      // gradient, zeros for the empty groups) on the device too.
      expect_same_grad(
          [transpose_w](const std::vector<Tensor>& in) {
            return grouped_mm(in[0], in[1], kCounts, transpose_w);
          },
          {x, w}, atol, rtol);
    }
  }
}

TEST_F(GroupedMmGpu, TransposedProductMatchesCpu) {
  for (DType t : {DType::F32, DType::BF16}) {
    const auto [atol, rtol] = tol(t);
    expect_same([](const std::vector<Tensor>& in) { return grouped_mm_tn(in[0], in[1], kCounts); },
                {rnd({64, 12}, t, 4), rnd({64, 20}, t, 5)}, atol, rtol);
  }
}

TEST_F(GroupedMmGpu, EmptyInnerDimensionAndNoRows) {
  expect_equal([](const std::vector<Tensor>& in) { return grouped_mm(in[0], in[1], kCounts); },
               {rnd({64, 0}), rnd({6, 8, 0})});
  const std::vector<int64_t> none{0, 0};
  expect_equal([&](const std::vector<Tensor>& in) { return grouped_mm(in[0], in[1], none); },
               {rnd({0, 8}), rnd({2, 5, 8})});
  expect_equal([&](const std::vector<Tensor>& in) { return grouped_mm_tn(in[0], in[1], none); },
               {rnd({0, 3}), rnd({0, 4})});
}

TEST_F(GroupedMmGpu, MoeModelLogitsAndGradientsMatchCpu) {
  models::moe::ModelArgs a;
  a.dim = 32;
  a.n_layers = 2;
  a.n_dense_layers = 1;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.vocab_size = 61;
  a.inter_dim = 48;
  a.moe_inter_dim = 16;
  a.n_routed_experts = 4;
  a.n_shared_experts = 1;
  a.top_k = 2;
  a.max_seq_len = 16;
  models::moe::Transformer cpu_model(a, /*seed=*/7), gpu_model(a, /*seed=*/7);
  gpu_model.to(Device::cuda());
  std::vector<int64_t> ids(2 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t((i * 37 + 11) % 61);
  const Tensor tokens = from_vector<int64_t>(ids, {2, 16}, TensorOptions{}.with_dtype(DType::I64));
  const Tensor w = rnd({2, 16, 61}, DType::F32, 8);
  const Tensor yc = cpu_model(tokens);
  const Tensor yg = gpu_model(on_cuda(tokens));
  EXPECT_REL_NEAR(yg, yc, 1e-5);
  sum(mul(yc, w)).backward();
  sum(mul(yg, on_cuda(w))).backward();
  const auto pc = cpu_model.named_parameters(), pg = gpu_model.named_parameters();
  ASSERT_EQ(pc.size(), pg.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    SCOPED_TRACE(pc[i].first);
    ASSERT_TRUE(pc[i].second.grad().defined());
    ASSERT_TRUE(pg[i].second.grad().defined());
    EXPECT_REL_NEAR(pg[i].second.grad(), pc[i].second.grad(), 1e-4);
  }
}

// Dense matmul layouts off the common paths: a broadcast operand (batch stride 0), transposed
// batched views (no fold into rows), slices at odd element offsets (2-byte aligned bf16 pointers,
// ld > cols), a stepped slice (copied first), and M, N or K of 1.
TEST_F(GroupedMmGpu, MatmulUnusualLayoutsMatchCpu) {
  for (DType t : {DType::F32, DType::BF16, DType::F64}) {
    SCOPED_TRACE(::testing::Message() << t);
    const auto [atol, rtol] = tol(t);
    const auto mm = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
    const auto mm_ta = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1], true); };
    expect_same(mm, {rnd({5, 7}, t, 20), rnd({3, 7, 4}, t, 21)}, atol, rtol);
    expect_same(mm_ta, {rnd({3, 7, 5}, t, 22), rnd({3, 7, 4}, t, 23)}, atol, rtol);
    expect_same(mm_ta, {rnd({3, 7, 5}, t, 24), rnd({7, 4}, t, 25)}, atol, rtol);
    expect_same(
        [](const std::vector<Tensor>& in) {
          return matmul(in[0].slice(1, 1, 8), in[1].slice(0, 1, 8).slice(1, 1, 5));
        },
        {rnd({5, 9}, t, 26), rnd({9, 6}, t, 27)}, atol, rtol);
    expect_same(
        [](const std::vector<Tensor>& in) { return matmul(in[0].slice(1, 0, 14, 2), in[1]); },
        {rnd({5, 14}, t, 28), rnd({7, 3}, t, 29)}, atol, rtol);
    expect_same(mm, {rnd({1, 7}, t, 30), rnd({7, 1}, t, 31)}, atol, rtol);
    expect_same(mm, {rnd({6, 1}, t, 32), rnd({1, 5}, t, 33)}, atol, rtol);
    expect_same(mm, {rnd({4, 1, 9}, t, 34), rnd({9, 5}, t, 35)}, atol, rtol);
  }
}

// A reused block is counted whole when handed out and when freed: bytes in use come back to
// where they were, also when the block served is larger than the rounded request.
TEST_F(GroupedMmGpu, AllocatorCountsReusedLargerBlocksBothWays) {
  const Device d = Device::cuda();
  const TensorOptions on_gpu = TensorOptions{}.with_device(d);
  const int64_t mib = int64_t(1) << 20;
  const MemoryStats before = memory_stats(d);
  { const Tensor big = Tensor::empty({37 * mib / 4}, on_gpu); }  // f32: a 38 MiB block
  {
    const Tensor t = Tensor::empty({35 * mib / 4}, on_gpu);  // 36 MiB: may reuse the 38 MiB one
    EXPECT_GE(memory_stats(d).bytes_in_use, before.bytes_in_use + 35 * mib);
  }
  EXPECT_EQ(memory_stats(d).bytes_in_use, before.bytes_in_use);
  EXPECT_GE(memory_stats(d).bytes_in_use, 0);
}

// A small request never takes a large freed block (it would hold 2 MiB for a few bytes, and the
// next large request would cudaMalloc again); empty_cache hands every free block back.
TEST_F(GroupedMmGpu, AllocatorKeepsLargeBlocksForLargeRequests) {
  const Device d = Device::cuda();
  const TensorOptions on_gpu = TensorOptions{}.with_device(d);
  empty_cache(d);
  const MemoryStats empty = memory_stats(d);
  EXPECT_EQ(empty.bytes_reserved, empty.bytes_in_use);
  { const Tensor large = Tensor::empty({(int64_t(2) << 20) / 4}, on_gpu); }  // a 2 MiB block
  const MemoryStats before = memory_stats(d);
  EXPECT_EQ(before.bytes_reserved, empty.bytes_reserved + (int64_t(2) << 20));
  const Tensor small = Tensor::empty({64}, on_gpu);  // 256 bytes: a 512-byte block of its own
  EXPECT_EQ(memory_stats(d).bytes_in_use, before.bytes_in_use + 512);
  const Tensor large = Tensor::empty({(int64_t(2) << 20) / 4}, on_gpu);  // reuses the 2 MiB one
  EXPECT_EQ(memory_stats(d).bytes_reserved, before.bytes_reserved + 512);
}

}  // namespace
}  // namespace mt::runtime::gpu_test
