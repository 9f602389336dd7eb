// scaled_dot_product_attention on CUDA against the CPU op on the same inputs: out, lse (through
// the kernel tables) and dq/dk/dv. bf16 runs cuDNN's flash attention (f16 too), f32/f64 and the
// configurations cuDNN does not take run the reference CUDA kernels; the CPU computes in f32 on
// the upcast 16-bit values. MHA and GQA, causal and not, T = S in {1, 17, 128, 256}, D in
// {64, 128}; T != S (bottom-right causal), rows with no key, odd head dims, strided inputs,
// partial gradients, custom scales, grids past the launch cap, empty tensors, bit-identical
// reruns (deterministic algorithms) and cuDNN's non-deterministic backward. Skips without a CUDA
// device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/core/determinism.h"
#include "runtime/core/device_runtime.h"
#include "runtime/kernels/attention.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/factory.h"

namespace mt::runtime {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!cuda_is_available()) GTEST_SKIP() << "no CUDA device"

struct Case {
  int64_t B, Hq, Hkv, T, S, D, Dv;
  bool causal;
  DType dtype;
};

std::string describe(const Case& c) {
  return std::string(dtype_name(c.dtype)) + " B=" + std::to_string(c.B) +
         " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) +
         " T=" + std::to_string(c.T) + " S=" + std::to_string(c.S) + " D=" + std::to_string(c.D) +
         " Dv=" + std::to_string(c.Dv) + (c.causal ? " causal" : "");
}

// Relative-to-max tolerances: |a - b| <= tol * max|b| elementwise (with an absolute floor).
double tolerance(DType t) {
  switch (t) {
    case DType::F64:
      return 1e-10;
    case DType::F32:
      return 1e-4;
    default:
      return 2e-2;
  }
}

::testing::AssertionResult close_to_max(const Tensor& actual, const Tensor& expected, double tol,
                                        const std::string& what) {
  if (!actual.defined() || !expected.defined())
    return actual.defined() == expected.defined()
               ? ::testing::AssertionSuccess()
               : ::testing::AssertionFailure() << what << ": one result is undefined";
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << what << ": shapes differ";
  const auto a = actual.to(Device::cpu()).to_vector<double>();
  const auto b = expected.to(Device::cpu()).to_vector<double>();
  double scale = 0;
  for (double x : b)
    if (std::isfinite(x)) scale = std::max(scale, std::abs(x));
  // The floor (tol x 0.1, the inputs being O(1)) is for results that are 0 up to rounding
  // throughout: dq and dk when every query sees a single key.
  const double bound = tol * std::max(scale, 0.1);
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same_inf = std::isinf(a[i]) && a[i] == b[i];
    if (!same_inf && !(std::abs(a[i] - b[i]) <= bound))
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is " << a[i] << ", expected " << b[i] << " (bound "
             << bound << " = " << tol << " x max " << scale << ")";
  }
  return ::testing::AssertionSuccess();
}

// Values drawn in f32, rounded to `dtype` (so CPU and GPU see the same numbers).
Tensor random(const Shape& shape, DType dtype, uint64_t seed, const char* name) {
  return randn(shape, RandomKey(seed, name), TensorOptions{}.with_dtype(DType::F32)).to(dtype);
}

// The CPU's dtype for a case: f32 for 16-bit inputs (computed on the upcast values), else its own.
DType cpu_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

struct Grads {
  Tensor out, dq, dk, dv;
};

// out and the gradients of sum(out * dout) on `device`; q optionally stored as [B, T, H, D].
Grads run(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& dout0, bool causal,
          Device device, DType dtype, bool strided_q = false, bool grad_q = true,
          bool grad_kv = true, std::optional<double> scale = std::nullopt) {
  Tensor q = strided_q ? q0.transpose(1, 2).contiguous().to(dtype).to(device).transpose(1, 2)
                       : q0.to(dtype).to(device);
  q = q.detach();
  Tensor k = k0.to(dtype).to(device).detach(), v = v0.to(dtype).to(device).detach();
  if (grad_q) q.set_requires_grad(true);
  if (grad_kv) {
    k.set_requires_grad(true);
    v.set_requires_grad(true);
  }
  Grads g;
  g.out = scaled_dot_product_attention(q, k, v, causal, scale);
  EXPECT_EQ(g.out.dtype(), dtype);
  EXPECT_EQ(g.out.device(), device);
  if (grad_q || grad_kv) {
    g.out.backward(dout0.to(dtype).to(device));
    if (grad_q) g.dq = q.grad();
    if (grad_kv) {
      g.dk = k.grad();
      g.dv = v.grad();
    }
  }
  return g;
}

// Forward and backward of one case on CUDA and on the CPU; lse through the kernel tables.
void check_case(const Case& c, uint64_t seed, bool strided_q = false) {
  SCOPED_TRACE(describe(c) + (strided_q ? " strided q" : ""));
  const Tensor q = random({c.B, c.Hq, c.T, c.D}, c.dtype, seed, "q");
  const Tensor k = random({c.B, c.Hkv, c.S, c.D}, c.dtype, seed, "k");
  const Tensor v = random({c.B, c.Hkv, c.S, c.Dv}, c.dtype, seed, "v");
  const Tensor dout = random({c.B, c.Hq, c.T, c.Dv}, c.dtype, seed, "dout");
  const DType ref = cpu_dtype(c.dtype);
  const double tol = tolerance(c.dtype);

  const Grads gpu = run(q, k, v, dout, c.causal, Device::cuda(), c.dtype, strided_q);
  const Grads cpu = run(q, k, v, dout, c.causal, Device::cpu(), ref, strided_q);
  EXPECT_TRUE(close_to_max(gpu.out, cpu.out, tol, "out"));
  EXPECT_TRUE(close_to_max(gpu.dq, cpu.dq, tol, "dq"));
  EXPECT_TRUE(close_to_max(gpu.dk, cpu.dk, tol, "dk"));
  EXPECT_TRUE(close_to_max(gpu.dv, cpu.dv, tol, "dv"));

  // lse: the CUDA kernel takes 16-bit operands natively, with an f32 lse.
  const double scale = 1.0 / std::sqrt(double(c.D));
  const Shape ls{c.B, c.Hq, c.T}, os{c.B, c.Hq, c.T, c.Dv};
  const Device cuda = Device::cuda();
  Tensor out_g = empty(os, TensorOptions{}.with_dtype(c.dtype).with_device(cuda));
  Tensor lse_g = empty(ls, TensorOptions{}.with_dtype(ref).with_device(cuda));
  attention_forward_kernel(cuda, q.to(cuda), k.to(cuda), v.to(cuda), c.causal, scale, out_g, lse_g);
  Tensor out_c = empty(os, TensorOptions{}.with_dtype(ref));
  Tensor lse_c = empty(ls, TensorOptions{}.with_dtype(ref));
  attention_forward_kernel(Device::cpu(), q.to(ref), k.to(ref), v.to(ref), c.causal, scale, out_c,
                           lse_c);
  EXPECT_TRUE(close_to_max(lse_g, lse_c, c.dtype == ref ? tol : 1e-2, "lse"));
}

std::vector<Case> grid(DType dtype) {
  std::vector<Case> cases;
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{8, 2}, {4, 4}})
    for (bool causal : {true, false})
      for (int64_t t : {1, 17, 128, 256})
        for (int64_t d : {64, 128}) cases.push_back({2, hq, hkv, t, t, d, d, causal, dtype});
  return cases;
}

TEST(AttentionGpu, Bf16MatchesCpu) {
  SKIP_WITHOUT_CUDA();
  uint64_t seed = 100;
  for (const Case& c : grid(DType::BF16)) check_case(c, seed++);
}

TEST(AttentionGpu, F32MatchesCpu) {
  SKIP_WITHOUT_CUDA();
  uint64_t seed = 200;
  for (const Case& c : grid(DType::F32)) check_case(c, seed++);
}

TEST(AttentionGpu, F16AndF64MatchCpu) {
  SKIP_WITHOUT_CUDA();
  check_case({2, 8, 2, 128, 128, 64, 64, true, DType::F16}, 300);
  check_case({1, 4, 2, 33, 33, 16, 16, true, DType::F64}, 301);
  check_case({1, 4, 1, 20, 45, 8, 12, false, DType::F64}, 302);
}

// Bottom-right causal alignment (a KV cache: S > T), rows with no visible key (S < T, causal;
// cuDNN does not take them, the reference kernel does), and non-causal T != S.
TEST(AttentionGpu, QueriesAndKeysOfDifferentLengths) {
  SKIP_WITHOUT_CUDA();
  uint64_t seed = 400;
  for (DType dtype : {DType::BF16, DType::F32})
    for (bool causal : {true, false}) {
      check_case({2, 8, 2, 17, 130, 64, 64, causal, dtype}, seed++);
      check_case({1, 4, 4, 1, 256, 128, 128, causal, dtype}, seed++);
      check_case({2, 8, 2, 70, 33, 64, 64, causal, dtype}, seed++);
    }
}

// Head dims cuDNN does not take (not a multiple of 8; D != Dv) and sizes off the 32/128 grid.
TEST(AttentionGpu, OddHeadDims) {
  SKIP_WITHOUT_CUDA();
  uint64_t seed = 500;
  for (DType dtype : {DType::BF16, DType::F32}) {
    check_case({3, 6, 3, 45, 45, 20, 20, true, dtype}, seed++);
    check_case({1, 2, 1, 31, 77, 40, 24, false, dtype}, seed++);
    check_case({1, 3, 1, 5, 5, 1, 3, true, dtype}, seed++);
    check_case({1, 2, 2, 129, 129, 64, 128, true, dtype}, seed++);
  }
}

TEST(AttentionGpu, StridedQuery) {
  SKIP_WITHOUT_CUDA();
  check_case({2, 8, 2, 64, 64, 64, 64, true, DType::BF16}, 600, true);
  check_case({2, 8, 2, 37, 37, 64, 64, true, DType::F32}, 601, true);
}

// Forward and backward (cuDNN's backward graph takes the scale too; its cache is keyed by it).
TEST(AttentionGpu, CustomScale) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::BF16, DType::F32}) {
    const Tensor q = random({1, 4, 40, 64}, dtype, 700, "q"),
                 k = random({1, 2, 40, 64}, dtype, 700, "k"),
                 v = random({1, 2, 40, 64}, dtype, 700, "v"),
                 dout = random({1, 4, 40, 64}, dtype, 700, "dout");
    const DType ref = cpu_dtype(dtype);
    const double tol = tolerance(dtype);
    for (double scale : {0.05, 0.5}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " scale " + std::to_string(scale));
      const Grads g = run(q, k, v, dout, true, Device::cuda(), dtype, false, true, true, scale);
      const Grads c = run(q, k, v, dout, true, Device::cpu(), ref, false, true, true, scale);
      EXPECT_TRUE(close_to_max(g.out, c.out, tol, "out"));
      EXPECT_TRUE(close_to_max(g.dq, c.dq, tol, "dq"));
      EXPECT_TRUE(close_to_max(g.dk, c.dk, tol, "dk"));
      EXPECT_TRUE(close_to_max(g.dv, c.dv, tol, "dv"));
    }
  }
}

// More query rows (B * Hq * T), then more keys (B * Hkv * S), than the reference kernels' grid
// cap of 2^20 blocks: their grid-stride loops take the rest. Few keys per row keep the CPU side
// cheap and the f32 sums short.
TEST(AttentionGpu, RowsAndKeysBeyondTheGridCap) {
  SKIP_WITHOUT_CUDA();
  constexpr int64_t kHeads = (int64_t(1) << 17) + 1;
  check_case({1, 2, 1, (int64_t(1) << 19) + 7, 5, 8, 8, false, DType::F32}, 1100);
  check_case({1, 2 * kHeads, kHeads, 3, 8, 8, 8, true, DType::F32}, 1101);
}

// Only q, or only k and v, need a gradient: the kernels' partial paths.
TEST(AttentionGpu, PartialGradients) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor q = random({2, 8, 50, 64}, dtype, 800, "q"),
                 k = random({2, 2, 50, 64}, dtype, 800, "k"),
                 v = random({2, 2, 50, 64}, dtype, 800, "v"),
                 dout = random({2, 8, 50, 64}, dtype, 800, "dout");
    const DType ref = cpu_dtype(dtype);
    const double tol = tolerance(dtype);
    const Grads full = run(q, k, v, dout, true, Device::cpu(), ref);
    const Grads only_q = run(q, k, v, dout, true, Device::cuda(), dtype, false, true, false);
    EXPECT_TRUE(close_to_max(only_q.dq, full.dq, tol, "dq alone"));
    const Grads only_kv = run(q, k, v, dout, true, Device::cuda(), dtype, false, false, true);
    EXPECT_TRUE(close_to_max(only_kv.dk, full.dk, tol, "dk alone"));
    EXPECT_TRUE(close_to_max(only_kv.dv, full.dv, tol, "dv alone"));
  }
}

TEST(AttentionGpu, EmptyTensors) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::BF16, DType::F32}) {
    check_case({1, 2, 1, 0, 4, 64, 64, true, dtype}, 900);   // T = 0
    check_case({1, 2, 1, 3, 0, 64, 64, false, dtype}, 901);  // S = 0: out 0, lse -inf
    check_case({0, 2, 1, 3, 3, 64, 64, true, dtype}, 902);   // B = 0
  }
}

// With deterministic algorithms off, bf16 runs cuDNN's non-deterministic backward (the one
// training uses by default): the same gradients within the tolerance, for q as [B, T, H, D] too.
TEST(AttentionGpu, NonDeterministicBackwardMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  DeterministicAlgorithmsGuard fast(false);
  check_case({2, 8, 2, 256, 256, 128, 128, true, DType::BF16}, 1100);
  check_case({2, 8, 2, 256, 256, 64, 64, true, DType::BF16}, 1101, /*strided_q=*/true);
  check_case({2, 4, 4, 128, 128, 64, 64, false, DType::BF16}, 1102);
}

// Deterministic algorithms (the default): two runs give the same bits.
TEST(AttentionGpu, BitIdenticalReruns) {
  SKIP_WITHOUT_CUDA();
  DeterministicAlgorithmsGuard deterministic(true);
  for (DType dtype : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor q = random({2, 8, 96, 64}, dtype, 1000, "q"),
                 k = random({2, 2, 96, 64}, dtype, 1000, "k"),
                 v = random({2, 2, 96, 64}, dtype, 1000, "v"),
                 dout = random({2, 8, 96, 64}, dtype, 1000, "dout");
    const Grads a = run(q, k, v, dout, true, Device::cuda(), dtype);
    const Grads b = run(q, k, v, dout, true, Device::cuda(), dtype);
    for (auto [x, y, what] : {std::tuple{a.out, b.out, "out"}, std::tuple{a.dq, b.dq, "dq"},
                              std::tuple{a.dk, b.dk, "dk"}, std::tuple{a.dv, b.dv, "dv"}})
      EXPECT_EQ(x.to(Device::cpu()).to_vector<double>(), y.to(Device::cpu()).to_vector<double>())
          << what;
  }
}

}  // namespace
}  // namespace mt::runtime
