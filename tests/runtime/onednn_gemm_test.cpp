// The CPU's GEMM paths: oneDNN (bf16 with AVX512_BF16, f32 with AVX512F) and OpenBLAS (f32, and
// bf16 widened to f32), each against an f64 product of the same inputs for every transpose,
// batched and broadcast batches and strided views; the paths against each other; onednn_gemm's
// alpha, beta and output dtypes; and which path a CPU gets. Where the CPU lacks an instruction
// set only the OpenBLAS path exists, and the tests check that it is the one taken.
#include "runtime/cpu/onednn_gemm.h"

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

bool cpu_has(DType t) {
  return t == DType::BF16 ? __builtin_cpu_supports("avx512bf16")
                          : __builtin_cpu_supports("avx512f");
}
bool onednn_enabled(DType t) {
  return t == DType::BF16 ? cpu::onednn_bf16_gemm_enabled() : cpu::onednn_f32_gemm_enabled();
}
void set_onednn(DType t, bool on) {
  t == DType::BF16 ? cpu::set_onednn_bf16_gemm_enabled(on) : cpu::set_onednn_f32_gemm_enabled(on);
}

// The paths this CPU has for `t`: OpenBLAS always, oneDNN with the instructions.
std::vector<bool> paths(DType t) {
  return cpu_has(t) ? std::vector<bool>{false, true} : std::vector<bool>{false};
}

// Restores the process's choice of paths after a test that switches them.
struct PathGuard {
  bool bf16 = cpu::onednn_bf16_gemm_enabled(), f32 = cpu::onednn_f32_gemm_enabled();
  ~PathGuard() {
    cpu::set_onednn_bf16_gemm_enabled(bf16);
    cpu::set_onednn_f32_gemm_enabled(f32);
  }
};

// Each element of c within one rounding to c's dtype (2^-8 relative for bf16, 2^-24 for f32) of
// the f64 product of the same inputs, plus the f32 accumulation's error bound (generously
// k * 2^-23 * sum |a||b|).
void expect_one_rounding(const Tensor& c, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const Tensor exact = matmul(a.to(DType::F64), b.to(DType::F64), ta, tb);
  const Tensor mag = matmul(abs(a.to(DType::F64)), abs(b.to(DType::F64)), ta, tb);
  ASSERT_EQ(c.shape(), exact.shape());
  const std::vector<double> got = c.to_vector<double>(), want = exact.to_vector<double>(),
                            m = mag.to_vector<double>();
  const int64_t k = ta ? a.size(-2) : a.size(-1);
  const int rounding = c.dtype() == DType::BF16 ? -8 : -24;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound =
        std::ldexp(std::abs(want[i]), rounding) + double(k) * std::ldexp(m[i], -23);
    ASSERT_LE(std::abs(got[i] - want[i]), bound) << "element " << i << " of " << got.size();
  }
}

Shape matrix_shape(Shape batch, int64_t rows, int64_t cols, bool transposed) {
  batch.push_back(transposed ? cols : rows);
  batch.push_back(transposed ? rows : cols);
  return batch;
}

TEST(OnednnGemm, OnlyWhereTheCpuHasTheInstructions) {
  const auto env_off = [](const char* name, const char* off) {
    const char* e = std::getenv(name);
    return e && std::strcmp(e, off) == 0;
  };
  EXPECT_EQ(cpu::onednn_bf16_gemm_enabled(),
            cpu_has(DType::BF16) && !env_off("MT_CPU_BF16_GEMM", "widen"));
  EXPECT_EQ(cpu::onednn_f32_gemm_enabled(),
            cpu_has(DType::F32) && !env_off("MT_CPU_F32_GEMM", "openblas"));
  PathGuard guard;
  for (DType t : {DType::BF16, DType::F32})
    if (!cpu_has(t)) {
      EXPECT_THROW(set_onednn(t, true), Error) << dtype_name(t);
      EXPECT_FALSE(onednn_enabled(t));
    }
}

TEST(OnednnGemm, EveryTransposeWithinOneRoundingOnEveryPath) {
  PathGuard guard;
  for (DType t : {DType::BF16, DType::F32})
    for (bool onednn : paths(t)) {
      set_onednn(t, onednn);
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          // Sizes off the kernels' block sizes (odd m, n; k past a 32-wide dot product).
          Tensor a = randn_as(matrix_shape({}, 37, 75, ta), t, 1);
          Tensor b = randn_as(matrix_shape({}, 75, 29, tb), t, 2);
          SCOPED_TRACE(::testing::Message() << dtype_name(t) << " onednn " << onednn << " ta "
                                            << ta << " tb " << tb);
          const Tensor c = matmul(a, b, ta, tb);
          EXPECT_EQ(c.dtype(), t);
          expect_one_rounding(c, a, b, ta, tb);
        }
    }
}

TEST(OnednnGemm, BatchedBroadcastAndStridedOperands) {
  PathGuard guard;
  for (DType t : {DType::BF16, DType::F32})
    for (bool onednn : paths(t)) {
      set_onednn(t, onednn);
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " onednn " << onednn);
      // x[B, T, C] @ W[C, N]: the batch folds into rows (one GEMM).
      Tensor x = randn_as({3, 5, 40}, t, 3), w = randn_as({24, 40}, t, 4);
      expect_one_rounding(matmul(x, w, false, true), x, w, false, true);
      // Per-batch GEMMs with a broadcast operand.
      Tensor p = randn_as({2, 3, 8, 16}, t, 5), v = randn_as({3, 16, 12}, t, 6);
      expect_one_rounding(matmul(p, v), p, v, false, false);
      // A row-stepped view (leading dimension 2 rows) and a permuted one (a transposed operand).
      Tensor stepped = randn_as({2, 12, 33}, t, 7).slice(1, 0, 12, 2);
      Tensor perm = randn_as({33, 2, 9}, t, 8).permute({1, 0, 2});  // [2, 33, 9]
      expect_one_rounding(matmul(stepped, perm), stepped, perm, false, false);
    }
}

TEST(OnednnGemm, PathsAgreeToOneUlp) {
  PathGuard guard;
  for (DType t : {DType::BF16, DType::F32}) {
    if (!cpu_has(t)) continue;  // one path only; its accuracy is checked above
    Tensor a = randn_as({64, 256}, t, 9), b = randn_as({96, 256}, t, 10);
    set_onednn(t, false);
    const std::vector<float> openblas = matmul(a, b, false, true).to_vector<float>();
    set_onednn(t, true);
    const std::vector<float> onednn = matmul(a, b, false, true).to_vector<float>();
    const std::vector<double> mag =
        matmul(abs(a.to(DType::F64)), abs(b.to(DType::F64)), false, true).to_vector<double>();
    // Both accumulate in f32; the summation orders differ. In bf16 both round once, so a result
    // near a rounding boundary may land one bf16 step apart, never more; in f32 each is within
    // the accumulation's error bound (k * 2^-24 * sum |a||b|) of the exact product.
    int64_t differ = 0;
    for (size_t i = 0; i < onednn.size(); ++i) {
      const float ulp = std::ldexp(1.0f, std::ilogb(std::max(std::abs(openblas[i]), 1e-30f)) - 7);
      const double allowed = t == DType::BF16 ? ulp : 2 * 256 * std::ldexp(mag[i], -24);
      ASSERT_LE(std::abs(onednn[i] - openblas[i]), allowed) << dtype_name(t) << " element " << i;
      differ += onednn[i] != openblas[i];
    }
    if (t == DType::BF16) {
      EXPECT_LT(differ, int64_t(onednn.size()) / 10) << "most results should round alike";
    }
  }
}

TEST(OnednnGemm, AlphaBetaAndOutputDtypes) {
  PathGuard guard;
  for (DType t : {DType::BF16, DType::F32}) {
    if (!cpu_has(t)) continue;  // onednn_gemm is not called without the instructions
    const int64_t m = 5, n = 7, k = 48;
    Tensor a = randn_as({m, k}, t, 11), bt = randn_as({n, k}, t, 12);
    const std::vector<double> va = a.to_vector<double>(), vb = bt.to_vector<double>();
    std::vector<float> c(size_t(m * 8), 0.5f);  // ldc 8: the padding column must stay untouched
    cpu::onednn_gemm(t, m, n, k, {a.data_ptr(), k, 1}, {bt.data_ptr(), 1, k}, c.data(),
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
    EXPECT_THROW(cpu::onednn_gemm(t, m, n, k, {a.data_ptr(), k, 1}, {bt.data_ptr(), 1, k},
                                  c.data(), DType::F64, 8),
                 Error);
    EXPECT_THROW(cpu::onednn_gemm(DType::F16, m, n, k, {a.data_ptr(), k, 1},
                                  {bt.data_ptr(), 1, k}, c.data(), DType::F32, 8),
                 Error);
  }
}

}  // namespace
}  // namespace mt::runtime
