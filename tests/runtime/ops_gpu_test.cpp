// CUDA backend vs CPU backend: elementwise ops (unary, binary with broadcasting, scalars, where,
// clamp, in place), reductions (sum, mean, max/argmax), softmax and dropout. Forward and backward,
// f32/bf16/f64 (+ integers and bool where the op takes them), odd sizes, transposed and sliced
// operands, empty tensors. Skips without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <limits>

#include "runtime/core/allocator.h"
#include "runtime/core/host_copy.h"
#include "runtime/ops/dropout.h"
#include "runtime/ops/softmax.h"
#include "tests/testing/gpu_compare.h"
#include "tests/testing/errors.h"

namespace mt::runtime::gpu_test {
namespace {

class ElementwiseGpu : public GpuTest {};
class ReduceGpu : public GpuTest {};
class SoftmaxGpu : public GpuTest {};
class DropoutGpu : public GpuTest {};

const DType kFloats[] = {DType::F32, DType::BF16, DType::F64, DType::F16};

// Factories asked for a CUDA tensor build it on the host and copy it over (the MoE router, the
// text sampler and expert parallelism make index tensors this way).
TEST_F(ElementwiseGpu, FactoriesBuildOnTheDevice) {
  const TensorOptions on_gpu = TensorOptions{}.with_device(Device::cuda());
  const Tensor i = from_vector<int64_t>({3, -1, 7}, {3}, on_gpu.with_dtype(DType::I64));
  EXPECT_TRUE(i.device().is_cuda());
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{3, -1, 7}));
  const Tensor f = from_vector<double>({0.5, 1.5}, {2, 1}, on_gpu.with_dtype(DType::BF16));
  EXPECT_EQ(f.dtype(), DType::BF16);
  EXPECT_EQ(f.shape(), (Shape{2, 1}));
  EXPECT_EQ(f.to_vector<double>(), (std::vector<double>{0.5, 1.5}));
  EXPECT_EQ(arange(5, on_gpu.with_dtype(DType::I64)).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 1, 2, 3, 4}));
  const Tensor g = from_vector<float>({1, 2}, {2}, on_gpu.with_requires_grad(true));
  EXPECT_TRUE(g.device().is_cuda());
  EXPECT_TRUE(g.requires_grad());
}

// Pinned host memory: non-blocking copies return before they run (the stream is held), copy the
// values the source had when queued, and a pinned block stays out of reuse until they have run.
TEST_F(ElementwiseGpu, PinnedHostCopies) {
  const Tensor host = from_vector<float>({1, 2, 3, 4}, {2, 2});
  const Tensor pinned = host.pin_memory();
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_FALSE(host.is_pinned());
  EXPECT_TRUE(pinned.pin_memory().shares_storage_with(pinned));
  EXPECT_EQ(pinned.to(Device::cuda(), true).to_vector<float>(), host.to_vector<float>());
  EXPECT_FALSE(add(pinned, 1.0).is_pinned());  // results of ops are ordinary host tensors

  PinnedHostAllocator& allocator = *pinned_host_allocator();
  Tensor device_copy;
  void* first_block = nullptr;
  {
    testing::StreamBlocker hold;  // nothing queued below runs before hold.release()
    Tensor source = Tensor::empty_pinned({1 << 16}, DType::F32);
    source.fill_(1.0);
    first_block = source.data_ptr();
    device_copy = source.to(Device::cuda(), /*non_blocking=*/true);  // returns: the copy waits
    const int64_t reserved = allocator.stats(Device::cpu()).bytes_reserved;
    source = Tensor();  // freed while its copy is queued
    Tensor other = Tensor::empty_pinned({1 << 16}, DType::F32);
    EXPECT_NE(other.data_ptr(), first_block) << "a block was reused before its copy ran";
    EXPECT_GT(allocator.stats(Device::cpu()).bytes_reserved, reserved);
    other.fill_(2.0);  // would corrupt the queued copy if it shared the block
    hold.release();
  }
  const std::vector<float> copied = device_copy.to_vector<float>();  // waits for the stream
  EXPECT_EQ(copied, std::vector<float>(size_t(1) << 16, 1.0f));
  // Once the copy has run, both blocks are free again and serve the next requests.
  const int64_t reserved = allocator.stats(Device::cpu()).bytes_reserved;
  Tensor a = Tensor::empty_pinned({1 << 16}, DType::F32);
  Tensor b = Tensor::empty_pinned({1 << 16}, DType::F32);
  EXPECT_TRUE(a.data_ptr() == first_block || b.data_ptr() == first_block);
  EXPECT_EQ(allocator.stats(Device::cpu()).bytes_reserved, reserved);
}

// A non-blocking copy from pageable host memory is staged in pinned memory: it returns while the
// stream is held, copies the values of when it was made (the source may be overwritten at once),
// and a strided source arrives in row-major order; it still backpropagates to the host tensor.
TEST_F(ElementwiseGpu, NonBlockingCopyFromPageableMemoryIsQueued) {
  Tensor device_copy, strided_copy;
  Tensor source = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  {
    testing::StreamBlocker hold;  // the copies below cannot run before hold.release()
    device_copy = source.to(Device::cuda(), /*non_blocking=*/true);
    strided_copy = source.t().to(Device::cuda(), /*non_blocking=*/true);
    source.fill_(0.0);
    hold.release();
  }
  EXPECT_EQ(device_copy.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(strided_copy.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  const Tensor leaf = from_vector<float>({1, 2}, {2}, TensorOptions{}.with_requires_grad(true));
  sum(mul(leaf.to(Device::cuda(), /*non_blocking=*/true), 3.0)).backward();
  ASSERT_TRUE(leaf.grad().defined());
  EXPECT_EQ(leaf.grad().to_vector<float>(), (std::vector<float>{3, 3}));
}

// A HostCopy is queued, not waited for: it returns while the stream is held and holds the values
// of when it was queued (a strided source in row-major order); get() waits for the copy only, not
// for the work queued after it; one dropped unread is harmless.
TEST_F(ElementwiseGpu, HostCopyIsQueuedAndCollectedLater) {
  const Tensor x =
      from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}, TensorOptions{}.with_device(Device::cuda()));
  std::optional<HostCopy> copy, strided;
  {
    testing::StreamBlocker hold;
    copy.emplace(x);
    strided.emplace(x.t());
    { HostCopy dropped(x); }
    hold.release();
  }
  {
    testing::StreamBlocker hold(/*release_after_s=*/5);  // later work waits for it
    x.fill_(0.0);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(copy->get().to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.5)
        << "get() waited for work queued after the copy";
    EXPECT_EQ(strided->get().to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
    EXPECT_EQ(copy->get().to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    hold.release();
  }
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(6, 0.0f));
}

Tensor positive(const Tensor& x) { return add(abs(x), 0.25); }

TEST_F(ElementwiseGpu, UnaryFloatForwardBackward) {
  const UnaryOp ops[] = {UnaryOp::Neg,    UnaryOp::Exp,       UnaryOp::Log,  UnaryOp::Sqrt,
                         UnaryOp::Rsqrt,  UnaryOp::Abs,       UnaryOp::Sin,  UnaryOp::Cos,
                         UnaryOp::Tanh,   UnaryOp::Sigmoid,   UnaryOp::Relu, UnaryOp::Silu,
                         UnaryOp::Square, UnaryOp::Reciprocal};
  for (DType t : kFloats) {
    const auto [atol, rtol] = tol(t);
    for (UnaryOp op : ops) {
      SCOPED_TRACE(::testing::Message() << "op " << int(op) << " dtype " << t);
      const bool needs_positive = op == UnaryOp::Log || op == UnaryOp::Sqrt ||
                                  op == UnaryOp::Rsqrt || op == UnaryOp::Reciprocal;
      Tensor x = rnd({37, 19}, t, 3);
      if (needs_positive) x = positive(x);
      // contiguous, then a transposed view (strided loads)
      expect_same_grad([op](const auto& in) { return unary(op, in[0]); }, {x}, atol, rtol);
      expect_same_grad([op](const auto& in) { return unary(op, in[0].t()); }, {x}, atol, rtol);
    }
  }
}

TEST_F(ElementwiseGpu, UnaryIntegerAndLogical) {
  const Tensor i = from_vector<int64_t>({-5, 0, 7, std::numeric_limits<int32_t>::min(), 3, -1},
                                        {2, 3}, TensorOptions{}.with_dtype(DType::I32));
  for (DType t : {DType::I32, DType::I64}) {
    const Tensor x = i.to(t);
    for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Square, UnaryOp::Relu})
      expect_equal([op](const auto& in) { return unary(op, in[0]); }, {x});
  }
  const Tensor f = from_vector<double>({0.0, -0.0, 1.5, NAN}, {4});
  expect_equal([](const auto& in) { return logical_not(in[0]); }, {f});
  expect_equal([](const auto& in) { return logical_not(in[0]); }, {gt(f, 0.0)});
}

TEST_F(ElementwiseGpu, BinaryBroadcastForwardBackward) {
  const BinaryOp ops[] = {BinaryOp::Add,     BinaryOp::Sub,     BinaryOp::Mul, BinaryOp::Div,
                          BinaryOp::Maximum, BinaryOp::Minimum, BinaryOp::Pow};
  for (DType t : kFloats) {
    const auto [atol, rtol] = tol(t);
    for (BinaryOp op : ops) {
      SCOPED_TRACE(::testing::Message() << "op " << int(op) << " dtype " << t);
      Tensor a = rnd({5, 1, 33}, t, 1), b = rnd({3, 1}, t, 2);
      if (op == BinaryOp::Pow || op == BinaryOp::Div) a = positive(a), b = positive(b);
      auto f = [op](const auto& in) { return binary(op, in[0], in[1]); };
      expect_same_grad(f, {a, b}, atol, rtol);  // broadcast to [5, 3, 33]
      // transposed and sliced (step 2) operands
      Tensor c = rnd({33, 10}, t, 4), d = rnd({20, 33}, t, 5);
      if (op == BinaryOp::Pow || op == BinaryOp::Div) c = positive(c), d = positive(d);
      expect_same_grad(
          [op](const auto& in) { return binary(op, in[0].t(), in[1].slice(0, 0, 20, 2)); }, {c, d},
          atol, rtol);
      // a 0-D operand
      expect_same_grad(f, {a, positive(rnd({}, t, 6))}, atol, rtol);
    }
  }
}

TEST_F(ElementwiseGpu, ComparisonsAndLogic) {
  Tensor a = rnd({4, 1, 9}, DType::F32, 1), b = rnd({3, 9}, DType::F32, 2);
  a = where(gt(a, 1.0), full({}, NAN), a);  // some NaN
  for (BinaryOp op : {BinaryOp::Eq, BinaryOp::Ne, BinaryOp::Lt, BinaryOp::Le, BinaryOp::Gt,
                      BinaryOp::Ge, BinaryOp::LogicalAnd, BinaryOp::LogicalOr}) {
    expect_equal([op](const auto& in) { return binary(op, in[0], in[1]); }, {a, b});
    expect_equal([op](const auto& in) { return binary(op, in[0], in[0]); }, {a});
  }
  expect_equal([](const auto& in) { return logical_and(gt(in[0], 0.0), lt(in[1], 0.5)); }, {a, b});
  expect_equal([](const auto& in) { return ge(in[0], 0.25); }, {a});
  expect_equal([](const auto& in) { return eq(in[0], 3.0); },
               {from_vector<int64_t>({1, 3, 3, -2}, {4}, TensorOptions{}.with_dtype(DType::I64))});
}

TEST_F(ElementwiseGpu, IntegerArithmeticWrapsAndDivisionTruncates) {
  const TensorOptions i32 = TensorOptions{}.with_dtype(DType::I32);
  const Tensor a = from_vector<int64_t>(
      {7, -7, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), 9, 0}, {6},
      i32);
  const Tensor b = from_vector<int64_t>({2, 2, 1, -1, -4, 5}, {6}, i32);
  for (DType t : {DType::I32, DType::I64})
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div,
                        BinaryOp::Maximum, BinaryOp::Minimum})
      expect_equal([op](const auto& in) { return binary(op, in[0], in[1]); }, {a.to(t), b.to(t)});
  expect_equal([](const auto& in) { return div(in[0], 3.0); }, {a});
  const Tensor zero = on_cuda(zeros({6}, i32));
  EXPECT_THAT(testing::error_of([&] { div(on_cuda(a), zero); }),
              ::testing::HasSubstr("integer division by zero"));
  EXPECT_THAT(testing::error_of([&] { div(on_cuda(a), 0.0); }),
              ::testing::HasSubstr("integer division by zero"));
}

TEST_F(ElementwiseGpu, ScalarOps) {
  for (DType t : kFloats) {
    const auto [atol, rtol] = tol(t);
    const Tensor x = positive(rnd({41, 3}, t, 8));
    expect_same_grad([](const auto& in) { return add(in[0].t(), 1.5); }, {x}, atol, rtol);
    expect_same_grad([](const auto& in) { return sub(in[0], -2.0); }, {x}, atol, rtol);
    expect_same_grad([](const auto& in) { return mul(in[0], 3.0); }, {x}, atol, rtol);
    expect_same_grad([](const auto& in) { return div(in[0], 7.0); }, {x}, atol, rtol);
    expect_same_grad([](const auto& in) { return pow(in[0], 2.0); }, {x}, atol, rtol);
    expect_same_grad([](const auto& in) { return pow(in[0], 0.5); }, {x}, atol, rtol);
    expect_same_grad([](const auto& in) { return pow(in[0], -1.25); }, {x}, atol, rtol);
  }
}

TEST_F(ElementwiseGpu, WhereAndClamp) {
  for (DType t : kFloats) {
    const auto [atol, rtol] = tol(t);
    const Tensor c = rnd({7, 1}, DType::F32, 1), a = rnd({7, 13}, t, 2), b = rnd({13}, t, 3);
    expect_same_grad([](const auto& in) { return where(gt(in[0], 0.0), in[1], in[2]); }, {c, a, b},
                     atol, rtol);
    expect_same_grad([](const auto& in) { return clamp(in[0].t(), -0.5, 0.75); }, {a}, atol, rtol);
    expect_same_grad([](const auto& in) { return clamp(in[0], std::nullopt, 0.1); }, {a}, atol,
                     rtol);
  }
  const Tensor n = from_vector<double>({NAN, -3, 0.5, 9}, {4});
  expect_equal([](const auto& in) { return clamp(in[0], -1.0, 1.0); }, {n});
  const Tensor i =
      from_vector<int64_t>({-9, 0, 4, 100}, {4}, TensorOptions{}.with_dtype(DType::I64));
  expect_equal([](const auto& in) { return clamp(in[0], -2.5, 50.5); }, {i});
  expect_equal([](const auto& in) { return where(gt(in[0], 0), in[0], in[0]); }, {i});
}

TEST_F(ElementwiseGpu, InPlaceOnViews) {
  for (DType t : {DType::F32, DType::BF16}) {
    const auto [atol, rtol] = tol(t);
    const Tensor base = rnd({9, 12}, t, 1), other = rnd({12}, t, 2);
    auto f = [](const auto& in) {
      Tensor self = in[0].clone();
      const Tensor view = self.t().slice(0, 1, 12, 2);  // strided self
      add_(view, in[1].slice(0, 0, 6).unsqueeze(1), 0.5);
      mul_(view, 2.0);
      sub_(self, in[1]);
      div_(self, add(abs(in[1]), 1.0));
      add_(self, 1.0);
      clamp_(self, -1.0, 1.5);
      return self;
    };
    expect_same(f, {base, other}, atol, rtol);
  }
}

TEST_F(ElementwiseGpu, EmptyTensors) {
  const Tensor e = rnd({0, 5}), f = rnd({3, 0, 2});
  expect_same([](const auto& in) { return exp(in[0]); }, {e});
  expect_same([](const auto& in) { return add(in[0], in[1]); }, {e, rnd({5})});
  expect_same([](const auto& in) { return where(gt(in[0], 0.0), in[0], 1.0 * in[0]); }, {f});
  expect_same([](const auto& in) { return clamp(in[0], 0.0, 1.0); }, {f});
}

TEST_F(ReduceGpu, SumAndMeanOverDims) {
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (DType t : kFloats) {
    const auto [atol, rtol] = tol(t);
    const Tensor x = rnd({13, 7, 37}, t, 4);
    for (const auto& dims : dim_sets) {
      SCOPED_TRACE(::testing::Message() << "dtype " << t << " dims " << str(dims));
      expect_same_grad([dims](const auto& in) { return sum(in[0], dims); }, {x}, atol, rtol);
      expect_same_grad([dims](const auto& in) { return mean(in[0], dims, true); }, {x}, atol, rtol);
      // a permuted (non-contiguous) input
      expect_same_grad(
          [dims](const auto& in) {
            return sum(in[0].permute({2, 0, 1}), dims);
          },
          {x}, atol, rtol);
    }
  }
}

TEST_F(ReduceGpu, LongRowsColumnsAndIntegers) {
  // one block per output over 200003 elements; the column schedule ([3001, 2048] over dim 0)
  expect_same([](const auto& in) { return sum(in[0], {1}); }, {rnd({3, 200003}, DType::F32, 1)},
              1e-4, 1e-4);
  expect_same([](const auto& in) { return sum(in[0], {0}); }, {rnd({3001, 2048}, DType::F32, 2)},
              1e-4, 1e-4);
  expect_same([](const auto& in) { return mean(in[0], {0}); }, {rnd({3001, 2048}, DType::BF16, 2)},
              1e-2, 1e-2);
  expect_same([](const auto& in) { return sum(in[0]); }, {rnd({1000, 999}, DType::F64, 3)}, 1e-9,
              1e-9);
  const Tensor big = from_vector<int64_t>({std::numeric_limits<int64_t>::max(), 1, 5, -7}, {2, 2},
                                          TensorOptions{}.with_dtype(DType::I64));
  expect_equal([](const auto& in) { return sum(in[0]); }, {big});  // wraps
  expect_equal([](const auto& in) { return sum(in[0], {0}); }, {big.to(DType::I32)});
  expect_equal([](const auto& in) { return sum(gt(in[0], 0.0), {1}); }, {rnd({17, 301})});
}

TEST_F(ReduceGpu, EmptySums) {
  expect_same([](const auto& in) { return sum(in[0], {0}); }, {rnd({0, 3})});
  expect_equal([](const auto& in) { return mean(in[0], {0}); }, {rnd({0, 3})});  // NaN
  expect_same([](const auto& in) { return sum(in[0], {1}); }, {rnd({0, 3})});
}

TEST_F(ReduceGpu, MaxValuesAndFirstIndex) {
  for (DType t : kFloats) {
    const auto [atol, rtol] = tol(t);
    const Tensor x = rnd({11, 9, 301}, t, 5);
    for (int64_t d = 0; d < 3; ++d) {
      expect_same_grad([d](const auto& in) { return max(in[0], d).values; }, {x}, atol, rtol);
      expect_equal([d](const auto& in) { return max(in[0], d).indices; }, {x});
      expect_equal([d](const auto& in) { return argmax(in[0].transpose(0, 2), d, true); }, {x});
    }
    expect_same_grad([](const auto& in) { return amax(in[0], {0, 2}); }, {x}, atol, rtol);
    expect_same_grad([](const auto& in) { return max(in[0]); }, {x}, atol, rtol);
  }
  // ties: the first maximum; NaN wins (the first NaN)
  const Tensor ties =
      from_vector<double>({1, 3, 3, 2, 3, NAN, 0, NAN, -0.0, 0.0, -1, -0.0}, {3, 4});
  for (int64_t d = 0; d < 2; ++d) {
    expect_equal([d](const auto& in) { return max(in[0], d).indices; }, {ties});
    expect_equal([d](const auto& in) { return max(in[0], d).values; }, {ties});
  }
  const Tensor many_ties = full({5, 70000}, 2.0);
  expect_equal([](const auto& in) { return argmax(in[0], 1); }, {many_ties});
  expect_equal([](const auto& in) { return argmax(in[0], 0); }, {many_ties});
  // split reductions (a long row in 3 chunks above; columns of a tall matrix in 12): the first
  // maximum survives across chunks
  expect_equal([](const auto& in) { return argmax(in[0], 0); }, {full({3001, 2048}, 2.0)});
  const Tensor ints =
      from_vector<int64_t>({4, 9, 9, -1, 0, 9}, {2, 3}, TensorOptions{}.with_dtype(DType::I32));
  expect_equal([](const auto& in) { return max(in[0], 1).indices; }, {ints});
  expect_equal([](const auto& in) { return max(in[0], 0).values; }, {ints});
}

TEST_F(SoftmaxGpu, ForwardBackwardAlongEveryDim) {
  for (DType t : kFloats) {
    const auto [atol, rtol] = tol(t);
    const Tensor x = rnd({6, 257, 5}, t, 7);
    for (int64_t d = 0; d < 3; ++d) {
      SCOPED_TRACE(::testing::Message() << "dtype " << t << " dim " << d);
      expect_same_grad([d](const auto& in) { return softmax(in[0], d); }, {x}, atol, rtol);
      expect_same_grad([d](const auto& in) { return log_softmax(in[0], d); }, {x}, atol, rtol);
    }
    expect_same_grad([](const auto& in) { return log_softmax(in[0].transpose(0, 1), -1); }, {x},
                     atol, rtol);
  }
  // a long row (vocabulary-sized) with large logits
  expect_same_grad([](const auto& in) { return log_softmax(mul(in[0], 30.0), 1); },
                   {rnd({3, 50021})}, 1e-4, 1e-4);
  expect_same([](const auto& in) { return softmax(in[0], 0); }, {rnd({0, 4})});
}

TEST_F(DropoutGpu, MaskEqualsCpuBitwise) {
  for (DType t : {DType::F32, DType::BF16, DType::F64}) {
    const Tensor x = rnd({1031, 17}, t, 9);
    for (double p : {0.1, 0.5, 0.9}) {
      const RandomKey key(1234, "layers.3.dropout", 17);
      expect_equal([&](const auto& in) { return dropout(in[0], p, key); }, {x});
      // backward applies the same mask to dy
      const std::vector<Tensor> xc = to_device({x}, Device::cpu(), true);
      const std::vector<Tensor> xg = to_device({x}, Device::cuda(), true);
      const Tensor w = rnd(x.shape(), t, 10);
      sum(mul(dropout(xc[0], p, key), w)).backward();
      sum(mul(dropout(xg[0], p, key), on_cuda(w))).backward();
      EXPECT_TRUE(testing::all_close(on_cpu(xg[0].grad()), xc[0].grad(), 0, 0));
    }
  }
}

}  // namespace
}  // namespace mt::runtime::gpu_test
