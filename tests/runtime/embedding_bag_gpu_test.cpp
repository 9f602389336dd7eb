// CUDA table-batched embedding bags and fused row optimizers against the CPU backend: pooled
// (SUM, MEAN, per-sample weights, shared tables, empty bags, dims above a warp) and unpooled
// lookups in f32 / f64 / bf16, the row-sparse gradient handed to a sink (same rows, same sums)
// and the dense gradient, the id check's error, every row optimizer's update of weights and
// state, an EmbeddingBagCollection trained a few steps with a fused optimizer on each device, and
// that neither the lookup nor its backward makes the host wait for the GPU.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/kernels/embedding_optim.h"
#include "runtime/ops/embedding_bag.h"
#include "runtime/sparse/embedding_bag_collection.h"
#include "tests/testing/errors.h"
#include "tests/testing/gpu_compare.h"

namespace mt::runtime::gpu_test {
namespace {

class EmbeddingBagGpu : public GpuTest {};

const TensorOptions kI64 = TensorOptions{}.with_dtype(DType::I64);

// Three tables (the second wider than a warp, 70 columns), four features (1 and 3 share table 1),
// batch 9, lengths 0..5 with repeated ids.
struct Case {
  std::vector<Tensor> tables;
  TableBatchLayout layout;
  Tensor values, offsets, weights;
  int64_t batch = 9;
};

Case make_case(DType dtype) {
  Case c;
  const std::vector<std::pair<int64_t, int64_t>> shapes{{11, 8}, {23, 70}, {5, 33}};
  for (size_t t = 0; t < shapes.size(); ++t)
    c.tables.push_back(rnd({shapes[t].first, shapes[t].second}, dtype, 10 + t));
  c.layout.feature_table = {0, 1, 2, 1};
  c.layout.feature_pooling = {PoolingMode::Sum, PoolingMode::Mean, PoolingMode::Sum,
                              PoolingMode::Sum};
  std::vector<int64_t> values, offsets{0};
  uint64_t s = 12345;
  auto next = [&] { return (s = s * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int64_t f = 0; f < 4; ++f) {
    const int64_t rows = shapes[size_t(c.layout.feature_table[size_t(f)])].first;
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t len = int64_t(next() % 6);
      for (int64_t k = 0; k < len; ++k) values.push_back(int64_t(next() % uint64_t(rows)));
      offsets.push_back(int64_t(values.size()));
    }
  }
  c.values = from_vector<int64_t>(values, {int64_t(values.size())}, kI64);
  c.offsets = from_vector<int64_t>(offsets, {int64_t(offsets.size())}, kI64);
  c.weights = rnd({int64_t(values.size())}, DType::F32, 3);
  return c;
}

std::vector<Tensor> on(const std::vector<Tensor>& tables, Device d) {
  std::vector<Tensor> out;
  for (const Tensor& t : tables) out.push_back(t.to(d));
  return out;
}

// The pooled (or unpooled) lookup on `device`, its row-sparse gradients for upstream `up`.
struct Result {
  Tensor out;
  std::vector<RowSparseGrad> grads;
};

Result lookup(const Case& c, Device device, bool pooled, bool weighted, const Tensor& up) {
  Result r;
  TableGradSink sink = [&r](std::vector<RowSparseGrad>& g) { r.grads = g; };
  const std::vector<Tensor> tables = on(c.tables, device);
  // values / offsets stay on the host (as a data loader gives them); the op copies them over.
  r.out = pooled ? embedding_bags_batched(tables, c.values, c.offsets, c.batch, c.layout,
                                          weighted ? c.weights : Tensor(), sink)
                 : embedding_lookup_batched(tables, c.values, c.offsets, c.batch, c.layout, sink);
  EXPECT_EQ(r.out.device(), device);
  sum(mul(r.out, up.to(device))).backward();
  return r;
}

TEST_F(EmbeddingBagGpu, LookupsAndRowSparseGradientsMatchCpu) {
  for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
    const auto [atol, rtol] = tol(dtype);
    const Case c = make_case(dtype);
    for (const auto& [pooled, weighted] :
         std::vector<std::pair<bool, bool>>{{true, false}, {true, true}, {false, false}}) {
      SCOPED_TRACE(::testing::Message()
                   << dtype << (pooled ? " pooled" : " unpooled") << (weighted ? " weighted" : ""));
      // The upstream gradient: pooled [B, sum of the features' dims]; unpooled flat, one row per
      // value of each feature.
      const int64_t dims[] = {8, 70, 33, 70};
      const std::vector<int64_t> off = c.offsets.to_vector<int64_t>();
      int64_t flat = 0;
      for (int64_t f = 0; f < 4; ++f) flat += (off[(f + 1) * c.batch] - off[f * c.batch]) * dims[f];
      const Tensor up = pooled ? rnd({c.batch, 8 + 70 + 33 + 70}, dtype, 5) : rnd({flat}, dtype, 6);
      const Result cpu = lookup(c, Device::cpu(), pooled, weighted, up);
      const Result gpu = lookup(c, Device::cuda(), pooled, weighted, up);
      EXPECT_TRUE(testing::all_close(on_cpu(gpu.out), cpu.out, atol, rtol));
      ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
      for (size_t k = 0; k < cpu.grads.size(); ++k) {
        EXPECT_EQ(gpu.grads[k].table, cpu.grads[k].table);
        EXPECT_EQ(gpu.grads[k].num_rows, cpu.grads[k].num_rows);
        EXPECT_TRUE(gpu.grads[k].rows.device().is_cuda());
        EXPECT_EQ(gpu.grads[k].rows.to_vector<int64_t>(), cpu.grads[k].rows.to_vector<int64_t>());
        EXPECT_TRUE(
            testing::all_close(on_cpu(gpu.grads[k].values), cpu.grads[k].values, atol, rtol))
            << "table " << cpu.grads[k].table;
      }
    }
  }
}

// Forward and backward only queue GPU work: with the stream held (released by a watchdog after
// 3 s) both return at once, as a host wait would sit until the release; the results, read after
// it, are the CPU's.
TEST_F(EmbeddingBagGpu, LookupAndBackwardDoNotWaitForTheGpu) {
  const Case c = make_case(DType::F32);
  const std::vector<Tensor> tables = on(c.tables, Device::cuda());
  const Tensor up = rnd({c.batch, 8 + 70 + 33 + 70}, DType::F32, 5);
  const Tensor up_gpu = up.to(Device::cuda());
  const Result cpu = lookup(c, Device::cpu(), true, true, up);
  Result gpu;
  TableGradSink sink = [&gpu](std::vector<RowSparseGrad>& g) { gpu.grads = g; };
  double seconds = 0;
  {
    testing::StreamBlocker hold;
    std::thread watchdog([&hold] {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      hold.release();
    });
    const auto start = std::chrono::steady_clock::now();
    gpu.out = embedding_bags_batched(tables, c.values, c.offsets, c.batch, c.layout, c.weights,
                                     sink);
    sum(mul(gpu.out, up_gpu)).backward();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    watchdog.join();
  }
  EXPECT_LT(seconds, 1.5) << "the lookup or its backward waited for the GPU";
  EXPECT_TRUE(testing::all_close(on_cpu(gpu.out), cpu.out, 1e-5, 1e-5));
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t k = 0; k < cpu.grads.size(); ++k) {
    EXPECT_EQ(gpu.grads[k].rows.to_vector<int64_t>(), cpu.grads[k].rows.to_vector<int64_t>());
    EXPECT_TRUE(testing::all_close(on_cpu(gpu.grads[k].values), cpu.grads[k].values, 1e-5, 1e-5));
  }
}

TEST_F(EmbeddingBagGpu, DenseGradientsMatchCpu) {
  const Case c = make_case(DType::F32);
  expect_same_grad(
      [&c](const std::vector<Tensor>& tables) {
        return embedding_bags_batched(tables, c.values, c.offsets, c.batch, c.layout, c.weights);
      },
      c.tables);
}

TEST_F(EmbeddingBagGpu, EmptyBatchGivesZerosAndBadIdsAreNamed) {
  Case c = make_case(DType::F32);
  const std::vector<Tensor> tables = on(c.tables, Device::cuda());
  const Tensor no_values = from_vector<int64_t>({}, {0}, kI64);
  const Tensor empty_offsets = from_vector<int64_t>(
      std::vector<int64_t>(size_t(4 * c.batch + 1), 0), {4 * c.batch + 1}, kI64);
  const Tensor z = embedding_bags_batched(tables, no_values, empty_offsets, c.batch, c.layout);
  EXPECT_EQ(z.shape(), (Shape{c.batch, 181}));
  EXPECT_EQ(on_cpu(z).to_vector<double>(), std::vector<double>(size_t(c.batch * 181), 0.0));

  std::vector<int64_t> v = c.values.to_vector<int64_t>();
  v[v.size() / 2] = 1000;
  const Tensor bad = from_vector<int64_t>(v, {int64_t(v.size())}, kI64);
  const std::string cpu_error = testing::error_of(
      [&] { embedding_bags_batched(c.tables, bad, c.offsets, c.batch, c.layout); });
  EXPECT_NE(cpu_error.find("id 1000"), std::string::npos) << cpu_error;
  EXPECT_EQ(
      testing::error_of([&] { embedding_bags_batched(tables, bad, c.offsets, c.batch, c.layout); }),
      cpu_error);
}

// Every row optimizer, three steps on distinct random rows: weights and state agree. bf16 tables
// keep f32 state.
TEST_F(EmbeddingBagGpu, RowOptimizerUpdatesMatchCpu) {
  const int64_t V = 50, D = 70;
  const std::vector<int64_t> row_sets[] = {{3, 0, 49, 17}, {17, 5}, {3, 4, 5, 6, 7, 8, 9, 10}};
  for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
    for (RowOptimizer kind : {RowOptimizer::SGD, RowOptimizer::RowwiseAdagrad, RowOptimizer::Adam,
                              RowOptimizer::PartialRowwiseAdam}) {
      SCOPED_TRACE(::testing::Message() << dtype << " optimizer " << int(kind));
      const auto [atol, rtol] = tol(dtype);
      const TensorOptions so =
          TensorOptions{}.with_dtype(dtype == DType::F64 ? DType::F64 : DType::F32);
      const bool row_m1 = kind == RowOptimizer::RowwiseAdagrad;
      const bool row_m2 = kind == RowOptimizer::PartialRowwiseAdam;
      Tensor w = rnd({V, D}, dtype, 1);
      Tensor m1 = kind == RowOptimizer::SGD ? Tensor() : zeros({V, row_m1 ? 1 : D}, so);
      Tensor m2 = kind == RowOptimizer::Adam || row_m2 ? zeros({V, row_m2 ? 1 : D}, so) : Tensor();
      Tensor wg = on_cuda(w);
      Tensor m1g = m1.defined() ? on_cuda(m1) : Tensor(),
             m2g = m2.defined() ? on_cuda(m2) : Tensor();
      RowOptimizerHyper h;
      h.lr = 0.05;
      h.weight_decay = 0.01;
      h.eps = 1e-6;
      for (int step = 0; step < 3; ++step) {
        h.step = step + 1;
        const std::vector<int64_t>& r = row_sets[step];
        const Tensor rows = from_vector<int64_t>(r, {int64_t(r.size())}, kI64);
        const Tensor g = rnd({int64_t(r.size()), D}, dtype, 20 + step);
        embedding_row_update_kernel(Device::cpu(), kind, h, w, rows, g, m1, m2);
        embedding_row_update_kernel(Device::cuda(), kind, h, wg, on_cuda(rows), on_cuda(g), m1g,
                                    m2g);
      }
      EXPECT_TRUE(testing::all_close(on_cpu(wg), w, atol, rtol));
      if (m1.defined()) {
        EXPECT_TRUE(testing::all_close(on_cpu(m1g), m1, atol, rtol));
      }
      if (m2.defined()) {
        EXPECT_TRUE(testing::all_close(on_cpu(m2g), m2, atol, rtol));
      }
    }
  }
}

// An EmbeddingBagCollection with fused row-wise Adagrad, moved to the GPU: four steps of the same
// batches give the CPU's outputs, weights and optimizer state (which follows the table there).
TEST_F(EmbeddingBagGpu, CollectionWithFusedOptimizerTrainsAsOnCpu) {
  using namespace sparse;
  auto make = [] {
    EmbeddingOptimizerConfig opt;
    opt.type = EmbOptimType::RowwiseAdagrad;
    opt.lr = 0.1;
    EmbeddingBagConfig a;
    a.name = "t_a";
    a.num_embeddings = 40;
    a.embedding_dim = 48;
    a.feature_names = {"a"};
    a.optimizer = opt;
    EmbeddingBagConfig b = a;
    b.name = "t_b";
    b.num_embeddings = 7;
    b.embedding_dim = 16;
    b.feature_names = {"b", "c"};
    b.pooling = PoolingMode::Mean;
    auto ebc = std::make_shared<EmbeddingBagCollection>(std::vector<EmbeddingBagConfig>{a, b});
    ebc->init_weights(3);
    return ebc;
  };
  auto cpu = make(), gpu = make();
  gpu->to(Device::cuda());
  for (int step = 0; step < 4; ++step) {
    std::vector<int64_t> values, lengths;
    for (int64_t f = 0; f < 3; ++f) {
      for (int64_t b = 0; b < 5; ++b) {
        const int64_t len = (b + step + f) % 4;
        for (int64_t k = 0; k < len; ++k)
          values.push_back((b * 7 + k * 3 + step) % (f == 0 ? 40 : 7));
        lengths.push_back(len);
      }
    }
    const KeyedJaggedTensor kjt = KeyedJaggedTensor::from_lengths({"a", "b", "c"}, values, lengths);
    const Tensor up = rnd({5, 48 + 16 + 16}, DType::F32, 40 + step);
    const KeyedTensor yc = (*cpu)(kjt), yg = (*gpu)(kjt);
    EXPECT_TRUE(testing::all_close(on_cpu(yg.values), yc.values, 1e-5, 1e-5)) << "step " << step;
    sum(mul(yc.values, up)).backward();
    sum(mul(yg.values, on_cuda(up))).backward();
  }
  for (size_t t = 0; t < 2; ++t) {
    EXPECT_TRUE(testing::all_close(on_cpu(gpu->weights()[t]), cpu->weights()[t], 1e-5, 1e-5));
    const auto sc = cpu->fused_optimizer().table_state(t),
               sg = gpu->fused_optimizer().table_state(t);
    ASSERT_EQ(sc.size(), sg.size());
    for (size_t k = 0; k < sc.size(); ++k) {
      EXPECT_TRUE(sg[k].second.device().is_cuda());
      EXPECT_TRUE(testing::all_close(on_cpu(sg[k].second), sc[k].second, 1e-5, 1e-5))
          << sc[k].first;
    }
  }
}

}  // namespace
}  // namespace mt::runtime::gpu_test
