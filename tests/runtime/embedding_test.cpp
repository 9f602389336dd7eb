// embedding: gather values, the scatter-add gradient with repeated ids (finite differences, f32
// accumulation for bf16, bitwise independence from the thread count), errors.
#include "runtime/ops/embedding.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>

#include "runtime/autograd/gradcheck.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::randn64;
using testing::randn_as;

TensorOptions ids_options(DType dt = DType::I64) { return TensorOptions{}.with_dtype(dt); }

// Reference gather: out[i, :] = weight[ids[i], :].
std::vector<double> naive_gather(const Tensor& weight, const std::vector<int64_t>& ids) {
  const std::vector<double> w = weight.to_vector<double>();
  const int64_t D = weight.size(1);
  std::vector<double> out;
  for (int64_t id : ids)
    for (int64_t j = 0; j < D; ++j) out.push_back(w[id * D + j]);
  return out;
}

TEST(Embedding, GathersRowsForAnyIdShape) {
  Tensor w = randn_as({7, 3}, DType::F32, 1);
  const std::vector<int64_t> ids = {6, 0, 3, 3, 1, 6};
  for (DType dt : {DType::I64, DType::I32}) {
    Tensor out = embedding(w, from_vector<int64_t>(ids, {2, 3}, ids_options(dt)));
    EXPECT_EQ(out.shape(), (Shape{2, 3, 3}));
    EXPECT_EQ(out.to_vector<double>(), naive_gather(w, ids));
  }
  Tensor scalar_id = embedding(w, from_vector<int64_t>({4}, {}, ids_options()));
  EXPECT_EQ(scalar_id.shape(), (Shape{3}));
  EXPECT_EQ(scalar_id.to_vector<double>(), naive_gather(w, {4}));
}

TEST(Embedding, StridedWeights) {
  Tensor base = randn_as({10, 4}, DType::F32, 2);
  Tensor rows = base.slice(0, 0, 10, 2);              // [5, 4], row stride 8: read in place
  Tensor cols = randn_as({4, 5}, DType::F32, 3).t();  // [5, 4], column stride 5: copied
  const std::vector<int64_t> ids = {4, 0, 2};
  Tensor t = from_vector<int64_t>(ids, {3}, ids_options());
  EXPECT_EQ(embedding(rows, t).to_vector<double>(), naive_gather(rows.contiguous(), ids));
  EXPECT_EQ(embedding(cols, t).to_vector<double>(), naive_gather(cols.contiguous(), ids));
}

TEST(Embedding, GradientScatterAddsRepeatedIds) {
  Tensor w = randn64({5, 2}, 4);
  const std::vector<int64_t> ids = {1, 3, 1, 1, 0};
  Tensor g = randn64({5, 2}, 5, false);
  embedding(w, from_vector<int64_t>(ids, {5}, ids_options())).backward(g);
  std::vector<double> expect(10, 0.0);
  const std::vector<double> gv = g.to_vector<double>();
  for (size_t i = 0; i < ids.size(); ++i)
    for (int j = 0; j < 2; ++j) expect[ids[i] * 2 + j] += gv[i * 2 + j];
  EXPECT_TRUE(all_close(w.grad(), from_vector<double>(expect, {5, 2}, w.options()), 1e-12, 0));
}

TEST(Embedding, GradcheckWithRepeatedIds) {
  Tensor w = randn64({6, 3}, 6);
  Tensor ids = from_vector<int64_t>({2, 5, 2, 0, 2, 5}, {2, 3}, ids_options());
  auto r = autograd::gradcheck([&](const std::vector<Tensor>& in) { return embedding(in[0], ids); },
                               {w});
  EXPECT_TRUE(r.ok) << r.message;
  Tensor ws = randn64({12, 3}, 7, false).slice(0, 0, 12, 2).set_requires_grad(true);  // strided
  auto rs = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return embedding(in[0], ids); }, {ws});
  EXPECT_TRUE(rs.ok) << rs.message;
}

TEST(Embedding, Bf16GradientAccumulatesInF32) {
  // 300 ones summed in bf16 would stall at 256; summed in f32 and rounded once they give 300.
  Tensor w = zeros({4, 2}, TensorOptions{}.with_dtype(DType::BF16).with_requires_grad(true));
  Tensor ids = full({300}, 2, ids_options());
  sum(embedding(w, ids)).backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 0, 300, 300, 0, 0}));
}

TEST(Embedding, GradientIsBitwiseIndependentOfThreadCount) {
  const int64_t n = 20000, V = 37, D = 16;
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = (i * 7919 + i / 3) % V;
  Tensor t = from_vector<int64_t>(ids, {n}, ids_options());
  Tensor g = randn_as({n, D}, DType::F32, 8);
  auto grad_with_threads = [&](int threads) {
    const int prev = omp_get_max_threads();
    omp_set_num_threads(threads);
    Tensor w = zeros({V, D}, TensorOptions{}.with_requires_grad(true));
    embedding(w, t).backward(g);
    omp_set_num_threads(prev);
    return w.grad().contiguous();
  };
  Tensor one = grad_with_threads(1), many = grad_with_threads(4);
  ASSERT_EQ(one.numel(), many.numel());
  EXPECT_EQ(std::memcmp(one.data_ptr(), many.data_ptr(), one.nbytes()), 0);
}

TEST(Embedding, Errors) {
  Tensor w = zeros({10, 4});
  try {
    embedding(w, from_vector<int64_t>({1, 2, 12}, {3}, ids_options()));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("embedding"), std::string::npos) << msg;
    EXPECT_NE(msg.find("id 12"), std::string::npos) << msg;
    EXPECT_NE(msg.find("10"), std::string::npos) << msg;
  }
  EXPECT_THROW(embedding(w, from_vector<int64_t>({-1}, {1}, ids_options(DType::I32))), Error);
  EXPECT_THROW(embedding(w, zeros({3})), Error);                           // float ids
  EXPECT_THROW(embedding(zeros({10}), zeros({3}, ids_options())), Error);  // 1-D weight
}

}  // namespace
}  // namespace mt::runtime
