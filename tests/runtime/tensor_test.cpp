// Tensors: storage sharing, views, contiguous(), casts, copies, factories, memory accounting.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/core/allocator.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/grad_mode.h"
#include "runtime/core/host_copy.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;

Tensor iota(const Shape& shape, DType dtype = DType::F32) {
  std::vector<double> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(i);
  return from_vector(v, shape, TensorOptions{}.with_dtype(dtype));
}

TEST(Tensor, EmptyIsContiguousWithRowMajorStrides) {
  Tensor t = empty({2, 3, 4});
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.dtype(), DType::F32);
  EXPECT_TRUE(t.device().is_cpu());
}

TEST(Tensor, TransposeSharesStorageAndPermutesValues) {
  Tensor a = iota({2, 3});
  Tensor t = a.t();
  EXPECT_TRUE(t.shares_storage_with(a));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage_with(a));
  EXPECT_EQ(c.to_vector<float>(), t.to_vector<float>());
  EXPECT_TRUE(a.contiguous().same(a));  // no copy when already contiguous
}

// A tensor without elements is contiguous whatever its strides (a transposed or broadcast empty
// view): copies between devices take it as it is.
TEST(Tensor, TensorsWithoutElementsAreContiguous) {
  const Tensor e = empty({0, 3});
  EXPECT_TRUE(e.t().is_contiguous());
  const Tensor b = empty({0, 1}).expand({0, 5});
  EXPECT_EQ(b.strides()[1], 0);
  EXPECT_TRUE(b.is_contiguous());
  EXPECT_TRUE(b.contiguous().same(b));
  EXPECT_FALSE(iota({1, 3}).expand({2, 3}).is_contiguous());  // elements: strides still count
}

TEST(Tensor, ViewsWriteThroughToTheBase) {
  Tensor a = zeros({3, 4});
  a.narrow(1, 1, 2).fill_(7);
  a.select(0, 2).fill_(1);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 7, 7, 0, 0, 7, 7, 0, 1, 1, 1, 1}));
}

TEST(Tensor, ReshapeViewsWhenPossibleAndCopiesOtherwise) {
  Tensor a = iota({2, 3, 4});
  Tensor v = a.reshape({6, 4});
  EXPECT_TRUE(v.shares_storage_with(a));
  Tensor w = a.view({-1, 12});
  EXPECT_EQ(w.shape(), (Shape{2, 12}));
  Tensor t = a.transpose(1, 2);   // [2, 4, 3], not viewable as [8, 3]? it is: dims 0,1 merge
  Tensor r = t.reshape({2, 12});  // needs a copy
  EXPECT_FALSE(r.shares_storage_with(a));
  EXPECT_EQ(r.to_vector<float>()[1], 4.0f);
  EXPECT_THROW(t.view({2, 12}), Error);
  EXPECT_THROW(a.view({5, 5}), Error);
}

TEST(Tensor, SliceWithStepAndNegativeBounds) {
  Tensor a = iota({10});
  EXPECT_EQ(a.slice(0, 1, 8, 3).to_vector<int>(), (std::vector<int>{1, 4, 7}));
  EXPECT_EQ(a.slice(0, -3, 10).to_vector<int>(), (std::vector<int>{7, 8, 9}));
  EXPECT_THROW(a.narrow(0, 8, 3), Error);
}

TEST(Tensor, ExpandBroadcastsWithZeroStrides) {
  Tensor a = iota({3, 1});
  Tensor e = a.expand({2, 3, 4});
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_EQ(e.to_vector<float>()[5], 1.0f);
  EXPECT_THROW(a.expand({3, 2, 5}), Error);
  try {
    iota({3, 2}).expand({3, 4});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expand: cannot expand shape [3, 2] to [3, 4]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Tensor, SqueezeUnsqueezePermuteFlatten) {
  Tensor a = iota({2, 1, 3});
  EXPECT_EQ(a.squeeze().shape(), (Shape{2, 3}));
  EXPECT_EQ(a.squeeze(1).shape(), (Shape{2, 3}));
  EXPECT_EQ(a.squeeze(0).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(a.unsqueeze(-1).shape(), (Shape{2, 1, 3, 1}));
  Tensor p = iota({2, 3, 4}).permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.to_vector<int>()[1], 4);  // p[0,0,1] = a[0,1,0]
  EXPECT_EQ(iota({2, 3, 4}).flatten(1).shape(), (Shape{2, 12}));
  EXPECT_THROW(p.permute({0, 0, 1}), Error);
  EXPECT_THROW(a.squeeze(3), Error);
}

TEST(Tensor, CastsRoundTripAndRoundToNearestEven) {
  Tensor a = from_vector<double>({1.0, -2.5, 3.140625, 1e-3}, {4});
  EXPECT_EQ(a.to(DType::BF16).to(DType::F64).to_vector<double>(),
            (std::vector<double>{1.0, -2.5, 3.140625, 0.00099945068359375}));
  // 1 + 2^-8 is halfway between two bf16 values: ties go to even (1.0).
  Tensor h = from_vector<double>({1.0 + 1.0 / 256, 1.0 + 3.0 / 256}, {2});
  EXPECT_EQ(h.to(DType::BF16).to_vector<double>(), (std::vector<double>{1.0, 1.0 + 4.0 / 256}));
  Tensor f16 = from_vector<double>({65504, 1e-7, -0.5, 70000}, {4}).to(DType::F16);
  EXPECT_EQ(f16.to_vector<double>(),
            (std::vector<double>{65504, 1.1920928955078125e-07, -0.5, INFINITY}));
  EXPECT_EQ(from_vector<double>({2.7, -2.7, 1e30}, {3}).to(DType::I32).to_vector<int64_t>(),
            (std::vector<int64_t>{2, -2, 2147483647}));
  EXPECT_EQ(from_vector<double>({0, 3}, {2}).to(DType::Bool).to_vector<int>(),
            (std::vector<int>{0, 1}));
}

TEST(Tensor, CopyBroadcastsCastsAndHandlesOverlap) {
  Tensor dst = zeros({2, 3}, TensorOptions{}.with_dtype(DType::F64));
  dst.copy_(from_vector<float>({1, 2, 3}, {3}));
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  Tensor sq = iota({3, 3});
  sq.copy_(sq.t());  // overlapping source: must behave as if copied first
  EXPECT_EQ(sq.to_vector<int>(), (std::vector<int>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
  const uint64_t v0 = dst.version();
  dst.fill_(1);
  EXPECT_GT(dst.version(), v0);
  EXPECT_THROW(dst.copy_(zeros({4})), Error);
}

// Transposed copies go by tiles (runtime/cpu/copy.cpp): every element lands where the element
// loop would put it, for sizes off the tile grid, outer dims, casts, a transposed destination and
// a broadcast source.
TEST(Tensor, TransposedCopiesPutEveryElementInPlace) {
  for (const Shape& brc :
       {Shape{3, 70, 130}, Shape{1, 64, 64}, Shape{2, 1, 5}, Shape{4, 129, 2}, Shape{1, 300, 65}}) {
    const int64_t B = brc[0], R = brc[1], C = brc[2];
    SCOPED_TRACE(::testing::Message() << B << " x " << R << " x " << C);
    const Tensor src = iota({B, C, R});  // read as [B, R, C] through a permute
    auto expected = [&](int64_t b, int64_t r, int64_t c) { return double((b * C + c) * R + r); };
    const std::vector<double> out = src.permute({0, 2, 1}).contiguous().to_vector<double>();
    Tensor wide = empty({B, R, C}, TensorOptions{}.with_dtype(DType::F64));
    wide.copy_(src.permute({0, 2, 1}));  // with a cast
    const std::vector<double> cast = wide.to_vector<double>();
    // A transposed destination: [B, R, C] written through a view of a [B, C, R] tensor.
    Tensor base = empty({B, C, R});
    base.permute({0, 2, 1}).copy_(src.permute({0, 2, 1}));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const size_t i = size_t((b * R + r) * C + c);
          ASSERT_EQ(out[i], expected(b, r, c)) << b << "," << r << "," << c;
          ASSERT_EQ(cast[i], expected(b, r, c)) << b << "," << r << "," << c;
        }
    EXPECT_EQ(base.to_vector<double>(), src.to_vector<double>());
  }
  // A column broadcast along the rows of a contiguous destination.
  Tensor dst = empty({70, 90});
  dst.copy_(iota({70, 1}).expand({70, 90}));
  const std::vector<float> got = dst.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], float(i / 90)) << i;
}

TEST(Tensor, FactoriesFillValues) {
  EXPECT_EQ(full({2}, 3.5).to_vector<float>(), (std::vector<float>{3.5, 3.5}));
  EXPECT_EQ(ones({3}, TensorOptions{}.with_dtype(DType::I64)).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 1, 1}));
  Tensor r = arange(5);
  EXPECT_EQ(r.dtype(), DType::I64);
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1, 2, 0.25, TensorOptions{}).to_vector<float>(),
            (std::vector<float>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(scalar_tensor(2).dim(), 0);
  EXPECT_EQ(scalar_tensor(2).item<float>(), 2.0f);
  EXPECT_THROW(from_vector<float>({1, 2, 3}, {2, 2}), Error);
  EXPECT_THROW(empty({2, -1}), Error);
}

TEST(Tensor, MemoryAccountingTracksInUseAndPeak) {
  const Device cpu = Device::cpu();
  reset_peak_memory(cpu);
  const int64_t before = memory_stats(cpu).bytes_in_use;
  {
    Tensor a = empty({1024, 256});  // 1 MiB
    EXPECT_EQ(memory_stats(cpu).bytes_in_use, before + (1 << 20));
    Tensor view = a.t();  // views allocate nothing
    EXPECT_EQ(memory_stats(cpu).bytes_in_use, before + (1 << 20));
  }
  EXPECT_EQ(memory_stats(cpu).bytes_in_use, before);
  EXPECT_GE(memory_stats(cpu).peak_bytes_in_use, before + (1 << 20));
  reset_peak_memory(cpu);
  EXPECT_EQ(memory_stats(cpu).peak_bytes_in_use, before);
}

TEST(Tensor, DataAccessChecksDType) {
  Tensor a = zeros({2});
  EXPECT_NO_THROW(a.data<float>());
  EXPECT_THROW(a.data<double>(), Error);
  EXPECT_THROW(a.item<float>(), Error);
  EXPECT_THROW(Tensor().shape(), Error);
}

TEST(Device, NamesParseAndCudaIsAbsentOnCpuBuilds) {
  EXPECT_EQ(device_from_name("cuda:1"), Device::cuda(1));
  EXPECT_EQ(device_from_name("cpu"), Device::cpu());
  EXPECT_THROW(device_from_name("tpu"), Error);
  EXPECT_THROW(dtype_from_name("f8"), Error);
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::BF16);
  if (!cuda_is_available()) {
    EXPECT_THROW(zeros({2}).to(Device::cuda(0)), Error);
  }
}

TEST(Device, PinnedHostMemoryNeedsAGpu) {
  const Tensor a = from_vector<float>({1, 2, 3}, {3});
  EXPECT_FALSE(a.is_pinned());
  EXPECT_TRUE(a.to(Device::cpu(), /*non_blocking=*/true).shares_storage_with(a));
  if (pinned_host_allocator() != nullptr) {
    GTEST_SKIP() << "a GPU is here: pinned memory is tested in ops_gpu_test (PinnedHostCopies)";
  }
  EXPECT_THAT(testing::error_of([&] { a.pin_memory(); }),
              ::testing::HasSubstr("pinned host memory needs the CUDA backend and a GPU"));
  EXPECT_THAT(testing::error_of([&] { Tensor::empty_pinned({4}, DType::F32); }),
              ::testing::HasSubstr("pinned host memory needs the CUDA backend and a GPU"));
}

// A HostCopy of a host tensor is the tensor itself, detached (nothing to queue).
TEST(Device, HostCopyOfAHostTensorIsTheTensor) {
  const Tensor a = from_vector<float>({1, 2, 3}, {3}, TensorOptions{}.with_requires_grad(true));
  HostCopy copy(a);
  const Tensor got = copy.get();
  EXPECT_TRUE(got.shares_storage_with(a));
  EXPECT_FALSE(got.requires_grad());
  EXPECT_EQ(got.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_THROW(HostCopy{Tensor()}, Error);
}

}  // namespace
}  // namespace mt::runtime
