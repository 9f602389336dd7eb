// CUDA backend vs CPU backend: index_select, index_add(_), index_copy_, gather, scatter(_add),
// sort / argsort / topk and embedding, forward and backward, with repeated indices (deterministic
// accumulation: f32 results equal the CPU's bitwise), i32 and i64 indices, ties, NaN and -0 in
// sorts, odd sizes, empty tensors and out-of-range errors (raised at the next host read). Skips
// without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/core/deferred_errors.h"
#include "runtime/ops/embedding.h"
#include "runtime/ops/index.h"
#include "runtime/ops/sort.h"
#include "tests/testing/gpu_compare.h"
#include "tests/testing/errors.h"
#include "tests/testing/gpu.h"

namespace mt::runtime::gpu_test {
namespace {

class IndexGpu : public GpuTest {};
class SortGpu : public GpuTest {};
class EmbeddingGpu : public GpuTest {};

const DType kFloats[] = {DType::F32, DType::BF16, DType::F64};
// The index kernels also take f16 (its own accumulate instantiation, 2-byte copies).
const DType kIndexFloats[] = {DType::F32, DType::BF16, DType::F64, DType::F16};

Tensor ids(const std::vector<int64_t>& v, DType t = DType::I64, Shape shape = {}) {
  if (shape.empty()) shape = {int64_t(v.size())};
  return from_vector<int64_t>(v, shape, TensorOptions{}.with_dtype(t));
}

// Random ids in [0, n) (many repeats when count > n).
Tensor random_ids(const Shape& shape, int64_t n, DType t, uint64_t seed) {
  const Tensor u = rand(shape, RandomKey(seed, "ids"), TensorOptions{}.with_dtype(DType::F64), 0,
                        double(n) - 1e-9);
  return u.to(t);  // truncates toward zero
}

TEST_F(IndexGpu, IndexSelectAndBackward) {
  for (DType t : kIndexFloats) {
    const auto [atol, rtol] = tol(t);
    const Tensor x = rnd({9, 33, 5}, t, 1);
    for (DType it : {DType::I64, DType::I32}) {
      const Tensor idx = ids({4, 0, 32, 4, 4, 7, 31}, it);
      for (int64_t d : {0, 1, 2}) {
        const Tensor i = d == 1 ? idx : ids({1, 0, 1}, it);
        expect_same_grad([d](const auto& in) { return index_select(in[0], d, in[1]); }, {x, i},
                         atol, rtol);
        // a transposed x (the op makes it contiguous)
        expect_same_grad(
            [d](const auto& in) { return index_select(in[0].transpose(0, 2), d, in[1]); },
            {x, ids({0, 2, 1}, it)}, atol, rtol);
      }
    }
  }
  expect_same([](const auto& in) { return index_select(in[0], 0, in[1]); },
              {rnd({4, 3}), ids({}, DType::I64, {0})});
}

TEST_F(IndexGpu, IndexAddRepeatsAreDeterministic) {
  for (DType t : kIndexFloats) {
    const auto [atol, rtol] = tol(t);
    const Tensor x = rnd({5, 40, 3}, t, 2);
    // many repeats; 300 positions take the sorted schedule, the 3 below the per-thread walk
    const Tensor idx = random_ids({300}, 40, DType::I64, 3);
    const Tensor src = rnd({5, 300, 3}, t, 4);
    expect_same_grad([&](const auto& in) { return index_add(in[0], 1, in[1], in[2], 0.5); },
                     {x, idx, src}, atol, rtol);
    if (t == DType::F32 || t == DType::F64) {  // the CPU's order and rounding: bitwise equal
      expect_equal([](const auto& in) { return index_add(in[0], 1, in[1], in[2], 0.5); },
                   {x, idx.to(DType::I32), src});
      // alpha * src inexact: the product is rounded before the add, as on the CPU (no FMA)
      expect_equal([](const auto& in) { return index_add(in[0], 1, in[1], in[2], 0.3); },
                   {x, idx, src});
      expect_equal([](const auto& in) { return index_add(in[0], 1, in[1], in[2], -1.7); },
                   {x, idx.slice(0, 0, 7), src.slice(1, 0, 7).contiguous()});  // the walk
    }
    // in place on a transposed self
    expect_same(
        [](const auto& in) {
          Tensor self = in[0].clone().t();
          index_add_(self, 0, in[1], in[2]);
          return self;
        },
        {rnd({6, 40}, t, 5), idx, rnd({300, 6}, t, 6)}, atol, rtol);
  }
  const Tensor xi = ids({1, 2, 3, 4}, DType::I32);
  expect_equal([](const auto& in) { return index_add(in[0], 0, in[1], in[2], 3.0); },
               {xi, ids({3, 3, 0}), ids({5, -1, 7}, DType::I32)});
}

// index_copy_ copies values: equal to the CPU's bitwise, repeated rows included (the last wins),
// on a transposed self, from an expanded source (zeroing rows, as evictions do).
TEST_F(IndexGpu, IndexCopyInPlace) {
  for (DType t : kIndexFloats) {
    const Tensor idx = random_ids({30}, 40, DType::I64, 7);
    expect_equal(
        [](const auto& in) {
          Tensor self = in[0].clone();
          index_copy_(self, 1, in[1], in[2]);
          return self;
        },
        {rnd({5, 40, 3}, t, 8), idx, rnd({5, 30, 3}, t, 9)});
    expect_equal(
        [](const auto& in) {
          Tensor self = in[0].clone().t();
          index_copy_(self, 0, in[1], zeros({}, self.options()).expand({3, 6}));
          return self;
        },
        {rnd({6, 40}, t, 10), ids({39, 0, 39}, DType::I32)});
  }
}

TEST_F(IndexGpu, GatherScatterAndBackward) {
  for (DType t : kIndexFloats) {
    const auto [atol, rtol] = tol(t);
    const Tensor x = rnd({7, 11, 4}, t, 1);
    for (int64_t d = 0; d < 3; ++d) {
      SCOPED_TRACE(::testing::Message() << "dtype " << t << " dim " << d);
      Shape is = {5, 9, 3};
      const Tensor idx = random_ids(is, x.size(d), DType::I64, 10 + uint64_t(d));  // repeats
      expect_same_grad([d](const auto& in) { return gather(in[0], d, in[1]); }, {x, idx}, atol,
                       rtol);
      // gather from a transposed (non-contiguous) x of shape [4, 11, 7]
      const Tensor idx_t = random_ids({3, 9, 5}, x.size(2 - d), DType::I32, 30 + uint64_t(d));
      expect_same_grad([d](const auto& in) { return gather(in[0].transpose(0, 2), d, in[1]); },
                       {x, idx_t}, atol, rtol);
      const Tensor src = rnd({6, 10, 3}, t, 20);  // larger than the index: the extent is used
      expect_same_grad([d](const auto& in) { return scatter_add(in[0], d, in[1], in[2]); },
                       {x, idx, src}, atol, rtol);
      expect_same_grad([d](const auto& in) { return scatter(in[0], d, in[1], in[2]); },
                       {x, idx, src}, atol, rtol);
      // last write wins along dim, exactly as on the CPU; src transposed (any strides)
      expect_equal([d](const auto& in) { return scatter(in[0], d, in[1], in[2].transpose(0, 2)); },
                   {x, idx.to(DType::I32), rnd({3, 10, 6}, t, 21)});
      if (t == DType::F32 || t == DType::F64)
        expect_equal([d](const auto& in) { return scatter_add(in[0], d, in[1], in[2]); },
                     {x, idx, src});
    }
  }
  const Tensor b = gt(rnd({4, 6}), 0.0);
  expect_equal([](const auto& in) { return gather(in[0], 1, in[1]); },
               {b, ids({0, 5, 5, 1, 2, 3, 0, 0}, DType::I64, {4, 2})});
}

// A bad index does not make the host wait: the op returns while the stream is held, the next host
// read raises the error (naming the index and its position) once, and the device stays usable.
// Unheld, a fast GPU's verdict may arrive before the op returns, and the op raises it then.
TEST_F(IndexGpu, OutOfRangeIndicesFailAtTheNextHostRead) {
  const Tensor x = on_cuda(rnd({4, 3}));
  const Tensor bad_index = on_cuda(ids({1, 2, 4, -1, 7}));
  Tensor y;
  {
    // Held: no verdict can arrive before the op returns.
    testing::StreamBlocker hold(/*release_after_s=*/3);
    EXPECT_NO_THROW(y = index_select(x, 0, bad_index));
  }
  const std::string e = testing::error_of([&] { (void)on_cpu(y); });
  EXPECT_THAT(e, ::testing::HasSubstr("index 4 (at position 2 of the index) is out of range"));
  EXPECT_EQ(pending_verdicts(), 0);
  const Tensor bad_gather_index = on_cuda(ids({0, 3}, DType::I32, {1, 2}));
  EXPECT_THAT(testing::error_of([&] {
                (void)on_cpu(gather(x, 1, bad_gather_index));
              }),
              ::testing::HasSubstr("index 3 (at position 1"));
  // index_add_ skips the bad targets rather than write outside self
  const Tensor self = on_cuda(rnd({4, 3}));
  const Tensor source = on_cuda(rnd({5, 3}));
  EXPECT_THAT(testing::error_of([&] {
                index_add_(self, 0, bad_index, source);  // raises here if the verdict is back
                synchronize(x.device());
              }),
              ::testing::HasSubstr("index_add_: index 4"));
  EXPECT_NO_THROW(synchronize(x.device()));
  expect_equal([](const auto& in) { return index_select(in[0], 0, in[1]); },
               {rnd({4, 3}), ids({3, 0, 0})});
}

TEST_F(SortGpu, SortArgsortTopkMatchCpu) {
  for (DType t : {DType::F32, DType::BF16, DType::F64, DType::F16, DType::I32, DType::I64}) {
    SCOPED_TRACE(::testing::Message() << "dtype " << t);
    // whole numbers: many ties
    const Tensor x = mul(rnd({6, 301, 3}, DType::F64, 3), 4.0).to(DType::I32).to(t);
    for (int64_t d = 0; d < 3; ++d)
      for (bool desc : {false, true}) {
        expect_equal([d, desc](const auto& in) { return sort(in[0], d, desc).values; }, {x});
        expect_equal([d, desc](const auto& in) { return sort(in[0], d, desc).indices; }, {x});
        expect_equal([d, desc](const auto& in) { return topk(in[0], 2, d, !desc).indices; }, {x});
        expect_equal([d, desc](const auto& in) { return topk(in[0], 2, d, !desc).values; }, {x});
      }
  }
  // NaN (all equal, above numbers), -0 equal to +0, infinities; stable in both directions
  const Tensor s =
      from_vector<double>({3, NAN, -0.0, 0.0, -INFINITY, 1, NAN, INFINITY, 0.0, 3}, {2, 5});
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16})
    for (bool desc : {false, true})
      for (int64_t d : {0, 1}) {
        expect_equal([=](const auto& in) { return sort(in[0], d, desc).indices; }, {s.to(t)});
        expect_equal([=](const auto& in) { return sort(in[0], d, desc).values; }, {s.to(t)});
      }
  expect_equal([](const auto& in) { return argsort(in[0], 0, true); }, {gt(rnd({33, 2}), 0.0)});
  expect_same_grad([](const auto& in) { return topk(in[0], 5, -1).values; }, {rnd({7, 1000})});
  expect_same_grad([](const auto& in) { return sort(in[0].t(), 0).values; }, {rnd({17, 9})});
  expect_equal([](const auto& in) { return topk(in[0], 0, 1).indices; }, {rnd({3, 4})});
  expect_equal([](const auto& in) { return sort(in[0], 1).indices; }, {rnd({0, 4})});
  expect_equal([](const auto& in) { return sort(in[0], 0).values; }, {rnd({100003})});
}

TEST_F(EmbeddingGpu, ForwardBackwardMatchCpu) {
  for (DType t : kFloats) {
    const auto [atol, rtol] = tol(t);
    const Tensor w = rnd({97, 33}, t, 1);
    for (DType it : {DType::I64, DType::I32}) {
      const Tensor i = random_ids({4, 129}, 97, it, 2);  // many repeated ids
      expect_same_grad([](const auto& in) { return embedding(in[0], in[1]); }, {w, i}, atol, rtol);
      // rows read in place from a row-strided weight (a column slice)
      expect_same_grad([](const auto& in) { return embedding(in[0].slice(1, 3, 20), in[1]); },
                       {w, i}, atol, rtol);
    }
    // the backward sums each id's rows in position order: bitwise the CPU's result
    const std::vector<Tensor> wc = to_device({w}, Device::cpu(), true);
    const std::vector<Tensor> wg = to_device({w}, Device::cuda(), true);
    const Tensor i = random_ids({1000}, 97, DType::I64, 3), g = rnd({1000, 33}, t, 4);
    sum(mul(embedding(wc[0], i), g)).backward();
    sum(mul(embedding(wg[0], on_cuda(i)), on_cuda(g))).backward();
    EXPECT_TRUE(testing::all_close(on_cpu(wg[0].grad()), wc[0].grad(), 0, 0));
  }
  expect_same([](const auto& in) { return embedding(in[0], in[1]); },
              {rnd({5, 4}), ids({}, DType::I64, {0})});
  // A bad id is named at the next host read (the forward skips it, the backward too).
  const Tensor w = on_cuda(rnd({10, 4})).set_requires_grad(true);
  const Tensor bad_ids = on_cuda(ids({1, 10, 3}, DType::I32));
  Tensor y;
  {
    // Held: no verdict can arrive before the op returns.
    testing::StreamBlocker hold(/*release_after_s=*/3);
    EXPECT_NO_THROW(y = embedding(w, bad_ids));
  }
  EXPECT_THAT(testing::error_of([&] {
                sum(y).backward();
                (void)on_cpu(y);
              }),
              ::testing::HasSubstr("embedding: id 10 at position [1] is outside [0, 10)"));
  EXPECT_EQ(pending_verdicts(), 0);
}

}  // namespace
}  // namespace mt::runtime::gpu_test
