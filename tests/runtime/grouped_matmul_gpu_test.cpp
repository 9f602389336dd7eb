// CUDA grouped_mm and grouped_mm_tn against the CPU backend (both weight layouts, f32/bf16/f64,
// empty groups, forward and gradients), and a tiny MoE model (router, grouped experts, shared
// expert) whose logits and parameter gradients on the GPU match the CPU's. Skips without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "models/moe/model.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/grouped_matmul.h"
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

}  // namespace
}  // namespace mt::runtime::gpu_test
