// The CPU's bf16 GEMMs: the native path (oneDNN, AVX512_BF16) and the widening path (OpenBLAS on
// f32 copies) against an f64 product of the same bf16 inputs, for every transpose, batched and
// broadcast batches, strided views; the two paths against each other; bf16_gemm's alpha, beta and
// f32 output; and which path a CPU gets. On a CPU without AVX512_BF16 only the widening path
// exists, and the tests check that it is the one taken.
#include "runtime/cpu/bf16_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::randn_as;

bool cpu_has_bf16() { return __builtin_cpu_supports("avx512bf16"); }

// The paths this CPU has: widening always, native with AVX512_BF16.
std::vector<bool> paths() { return cpu_has_bf16() ? std::vector<bool>{false, true} : std::vector<bool>{false}; }

// Restores the process's choice of path after a test that switches it.
struct PathGuard {
  bool saved = cpu::native_bf16_gemm_enabled();
  ~PathGuard() { cpu::set_native_bf16_gemm_enabled(saved); }
};

// Each element of c (bf16) within one bf16 rounding (2^-8 relative) of the f64 product of the
// same inputs, plus the f32 accumulation's error bound (k * 2^-24 * sum |a||b|, generously).
void expect_one_rounding(const Tensor& c, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const Tensor exact = matmul(a.to(DType::F64), b.to(DType::F64), ta, tb);
  const Tensor mag = matmul(abs(a.to(DType::F64)), abs(b.to(DType::F64)), ta, tb);
  ASSERT_EQ(c.shape(), exact.shape());
  const std::vector<double> got = c.to_vector<double>(), want = exact.to_vector<double>(),
                            m = mag.to_vector<double>();
  const int64_t k = ta ? a.size(-2) : a.size(-1);
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = std::ldexp(std::abs(want[i]), -8) + double(k) * std::ldexp(m[i], -23);
    ASSERT_LE(std::abs(got[i] - want[i]), bound) << "element " << i << " of " << got.size();
  }
}

Shape matrix_shape(Shape batch, int64_t rows, int64_t cols, bool transposed) {
  batch.push_back(transposed ? cols : rows);
  batch.push_back(transposed ? rows : cols);
  return batch;
}

TEST(Bf16Gemm, NativeOnlyWhereTheCpuHasAvx512Bf16) {
  const char* env = std::getenv("MT_CPU_BF16_GEMM");
  const bool widen = env && std::strcmp(env, "widen") == 0;
  EXPECT_EQ(cpu::native_bf16_gemm_enabled(), cpu_has_bf16() && !widen);
  if (!cpu_has_bf16()) {
    EXPECT_THROW(cpu::set_native_bf16_gemm_enabled(true), Error);
    EXPECT_FALSE(cpu::native_bf16_gemm_enabled());
  }
}

TEST(Bf16Gemm, EveryTransposeWithinOneRoundingOnEitherPath) {
  PathGuard guard;
  for (bool native : paths()) {
    cpu::set_native_bf16_gemm_enabled(native);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        // Sizes off the kernels' block sizes (odd m, n; k past a 32-wide dot product).
        Tensor a = randn_as(matrix_shape({}, 37, 75, ta), DType::BF16, 1);
        Tensor b = randn_as(matrix_shape({}, 75, 29, tb), DType::BF16, 2);
        SCOPED_TRACE(::testing::Message() << "native " << native << " ta " << ta << " tb " << tb);
        expect_one_rounding(matmul(a, b, ta, tb), a, b, ta, tb);
      }
  }
}

TEST(Bf16Gemm, BatchedBroadcastAndStridedOperands) {
  PathGuard guard;
  for (bool native : paths()) {
    cpu::set_native_bf16_gemm_enabled(native);
    SCOPED_TRACE(::testing::Message() << "native " << native);
    // x[B, T, C] @ W[C, N]: the batch folds into rows (one GEMM).
    Tensor x = randn_as({3, 5, 40}, DType::BF16, 3), w = randn_as({24, 40}, DType::BF16, 4);
    expect_one_rounding(matmul(x, w, false, true), x, w, false, true);
    // Per-batch GEMMs with a broadcast operand.
    Tensor p = randn_as({2, 3, 8, 16}, DType::BF16, 5), v = randn_as({3, 16, 12}, DType::BF16, 6);
    expect_one_rounding(matmul(p, v), p, v, false, false);
    // A row-stepped view (leading dimension 2 rows) and a permuted one (a transposed operand).
    Tensor stepped = randn_as({2, 12, 33}, DType::BF16, 7).slice(1, 0, 12, 2);
    Tensor perm = randn_as({33, 2, 9}, DType::BF16, 8).permute({1, 0, 2});  // [2, 33, 9]
    expect_one_rounding(matmul(stepped, perm), stepped, perm, false, false);
  }
}

TEST(Bf16Gemm, NativeAndWideningPathsAgreeToOneUlp) {
  if (!cpu_has_bf16()) {
    // Only one path here; its accuracy is checked above.
    EXPECT_FALSE(cpu::native_bf16_gemm_enabled());
    return;
  }
  PathGuard guard;
  Tensor a = randn_as({64, 256}, DType::BF16, 9), b = randn_as({96, 256}, DType::BF16, 10);
  cpu::set_native_bf16_gemm_enabled(false);
  const std::vector<float> widened = matmul(a, b, false, true).to_vector<float>();
  cpu::set_native_bf16_gemm_enabled(true);
  const std::vector<float> native = matmul(a, b, false, true).to_vector<float>();
  int64_t differ = 0;
  for (size_t i = 0; i < native.size(); ++i) {
    // Both accumulate in f32 and round once; the summation orders differ, so a result near a
    // rounding boundary may land one bf16 step apart, never more.
    const float ulp = std::ldexp(1.0f, std::ilogb(std::max(std::abs(widened[i]), 1e-30f)) - 7);
    ASSERT_LE(std::abs(native[i] - widened[i]), ulp) << "element " << i;
    differ += native[i] != widened[i];
  }
  EXPECT_LT(differ, int64_t(native.size()) / 10) << "most results should round alike";
}

TEST(Bf16Gemm, AlphaBetaAndF32Output) {
  if (!cpu_has_bf16()) {
    EXPECT_THROW(cpu::set_native_bf16_gemm_enabled(true), Error);
    return;
  }
  const int64_t m = 5, n = 7, k = 48;
  Tensor a = randn_as({m, k}, DType::BF16, 11), bt = randn_as({n, k}, DType::BF16, 12);
  const std::vector<double> va = a.to_vector<double>(), vb = bt.to_vector<double>();
  std::vector<float> c(size_t(m * 8), 0.5f);  // ldc 8: the padding column must stay untouched
  cpu::bf16_gemm(m, n, k, {a.data<bfloat16>(), k, 1}, {bt.data<bfloat16>(), 1, k}, c.data(),
                 DType::F32, 8, /*alpha=*/0.25f, /*beta=*/2.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        s += va[size_t(i * k + p)] * vb[size_t(j * k + p)];
        mag += std::abs(va[size_t(i * k + p)] * vb[size_t(j * k + p)]);
      }
      EXPECT_NEAR(c[size_t(i * 8 + j)], 0.25 * s + 1.0, 1e-5 * (1 + mag)) << i << "," << j;
    }
    EXPECT_EQ(c[size_t(i * 8 + 7)], 0.5f);
  }
  EXPECT_THROW(cpu::bf16_gemm(m, n, k, {a.data<bfloat16>(), k, 1}, {bt.data<bfloat16>(), 1, k},
                              c.data(), DType::F64, 8),
               Error);
}

}  // namespace
}  // namespace mt::runtime
