// scaled_dot_product_attention: forward against a naive composed reference (scores, mask,
// softmax, weighted sum as plain loops), gradcheck in f64 (MHA/GQA, causal and not, T != S,
// strided inputs, several blocks), bit-identical backward across thread counts, transposed
// [B, T, H, D] views taken in place, errors.
#include "runtime/ops/attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "runtime/autograd/gradcheck.h"
#include "runtime/cpu/onednn_gemm.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/join.h"
#include "runtime/ops/elementwise.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::randn64;
using testing::randn_as;

// softmax(q k^T * scale + mask) v per (batch, head) with query i seeing key j when
// j <= i + S - T (causal); a row that sees no key is zero.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                       double scale) {
  const auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  const int64_t B = q.shape()[0], Hq = q.shape()[1], T = q.shape()[2], D = q.shape()[3];
  const int64_t Hkv = k.shape()[1], S = k.shape()[2], Dv = v.shape()[3];
  std::vector<double> out(size_t(B * Hq * T * Dv), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(size_t(S), -std::numeric_limits<double>::infinity());
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < S; ++j) {
          if (causal && j > i + S - T) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += qv[((b * Hq + h) * T + i) * D + d] * kv[((b * Hkv + hk) * S + j) * D + d];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue;  // no visible key
        double sum = 0;
        for (int64_t j = 0; j < S; ++j) sum += std::exp(s[j] - mx);
        for (int64_t j = 0; j < S; ++j) {
          const double p = std::exp(s[j] - mx) / sum;
          for (int64_t d = 0; d < Dv; ++d)
            out[((b * Hq + h) * T + i) * Dv + d] += p * vv[((b * Hkv + hk) * S + j) * Dv + d];
        }
      }
    }
  return from_vector<double>(out, {B, Hq, T, Dv}, TensorOptions{}.with_dtype(DType::F64));
}

struct Case {
  int64_t B, Hq, Hkv, T, S, D, Dv;
  bool causal;
};

TEST(Attention, ForwardMatchesNaiveF64) {
  const std::vector<Case> cases = {
      {1, 4, 2, 5, 5, 4, 4, true},      {2, 4, 2, 5, 5, 4, 4, false},
      {1, 4, 4, 3, 7, 4, 4, true},      {1, 2, 1, 7, 3, 4, 4, true},     // rows with no key
      {2, 4, 2, 6, 9, 8, 3, false},     {1, 2, 1, 70, 135, 5, 6, true},  // several blocks
      {1, 3, 3, 100, 100, 4, 4, false}, {1, 1, 1, 0, 4, 4, 4, true},     // T = 0
      {1, 1, 1, 3, 0, 4, 4, false}};                                     // S = 0
  uint64_t seed = 1;
  for (const Case& c : cases) {
    Tensor q = randn64({c.B, c.Hq, c.T, c.D}, seed++, false);
    Tensor k = randn64({c.B, c.Hkv, c.S, c.D}, seed++, false);
    Tensor v = randn64({c.B, c.Hkv, c.S, c.Dv}, seed++, false);
    const double scale = 1.0 / std::sqrt(double(c.D));
    EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, c.causal),
                          naive_attention(q, k, v, c.causal, scale), 1e-12, 1e-10))
        << "T " << c.T << " S " << c.S << " causal " << c.causal;
  }
}

TEST(Attention, CustomScaleAndLargeScores) {
  Tensor q = randn64({1, 2, 6, 4}, 1, false), k = randn64({1, 2, 6, 4}, 2, false),
         v = randn64({1, 2, 6, 4}, 3, false);
  // A scale of 50 makes the scores span hundreds: the online softmax must stay finite.
  EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, true, 50.0),
                        naive_attention(q, k, v, true, 50.0), 1e-12, 1e-10));
}

TEST(Attention, F32AndBf16) {
  Tensor q = randn_as({2, 4, 37, 16}, DType::F32, 4), k = randn_as({2, 2, 80, 16}, DType::F32, 5),
         v = randn_as({2, 2, 80, 16}, DType::F32, 6);
  const Tensor ref = naive_attention(q, k, v, true, 0.25);
  Tensor y = scaled_dot_product_attention(q, k, v);
  EXPECT_EQ(y.dtype(), DType::F32);
  EXPECT_TRUE(all_close(y, ref, 1e-5, 1e-4));
  Tensor qb = q.to(DType::BF16), kb = k.to(DType::BF16), vb = v.to(DType::BF16);
  Tensor yb = scaled_dot_product_attention(qb, kb, vb);
  EXPECT_EQ(yb.dtype(), DType::BF16);
  EXPECT_TRUE(all_close(yb, naive_attention(qb, kb, vb, true, 0.25), 1e-2, 1e-2));
}

autograd::GradcheckResult check_grad(const Case& c, uint64_t seed, bool strided_q = false) {
  // strided_q: q stored as [B, T, H, D] (the projection's layout) and viewed as [B, H, T, D].
  Tensor q =
      strided_q
          ? randn64({c.B, c.T, c.Hq, c.D}, seed, false).transpose(1, 2).set_requires_grad(true)
          : randn64({c.B, c.Hq, c.T, c.D}, seed);
  Tensor k = randn64({c.B, c.Hkv, c.S, c.D}, seed + 1);
  Tensor v = randn64({c.B, c.Hkv, c.S, c.Dv}, seed + 2);
  const bool causal = c.causal;
  return autograd::gradcheck(
      [causal](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], causal);
      },
      {q, k, v});
}

TEST(Attention, GradcheckGroupedQuery) {
  for (bool causal : {true, false}) {
    for (int64_t B : {1, 2}) {
      auto r = check_grad({B, 4, 2, 5, 5, 4, 4, causal}, 10 + B);
      EXPECT_TRUE(r.ok) << "causal " << causal << " B " << B << ": " << r.message;
    }
  }
}

TEST(Attention, GradcheckTNotEqualS) {
  for (bool causal : {true, false}) {
    auto r1 = check_grad({1, 4, 2, 5, 7, 4, 4, causal}, 20);  // KV longer than queries
    EXPECT_TRUE(r1.ok) << "T < S, causal " << causal << ": " << r1.message;
    auto r2 = check_grad({1, 4, 2, 5, 3, 4, 3, causal}, 30);  // first causal rows see no key
    EXPECT_TRUE(r2.ok) << "T > S, causal " << causal << ": " << r2.message;
  }
}

TEST(Attention, GradcheckStridedQueryAndMultiQuery) {
  auto r = check_grad({2, 4, 1, 5, 5, 4, 4, true}, 40, /*strided_q=*/true);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Attention, GradcheckAcrossBlocks) {
  // T = 70 spans three query blocks, S = 75 two key blocks.
  auto r = check_grad({1, 2, 1, 70, 75, 3, 2, true}, 50);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Attention, GradcheckCustomScale) {
  Tensor q = randn64({1, 2, 4, 3}, 60), k = randn64({1, 2, 4, 3}, 61),
         v = randn64({1, 2, 4, 3}, 62);
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], false, 0.7);
      },
      {q, k, v});
  EXPECT_TRUE(r.ok) << r.message;
}

std::vector<uint32_t> bits_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint32_t> out(size_t(c.numel()));
  std::memcpy(out.data(), c.data<float>(), out.size() * 4);
  return out;
}

TEST(Attention, BitIdenticalAcrossThreadCounts) {
  // Large enough for the kernels to go parallel (several query and key blocks per head).
  const Tensor q0 = randn_as({2, 4, 128, 32}, DType::F32, 70);
  const Tensor k0 = randn_as({2, 2, 160, 32}, DType::F32, 71);
  const Tensor v0 = randn_as({2, 2, 160, 32}, DType::F32, 72);
  const Tensor dy = randn_as({2, 4, 128, 32}, DType::F32, 73);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<std::vector<uint32_t>>> runs;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Tensor q = q0.clone().set_requires_grad(true), k = k0.clone().set_requires_grad(true),
           v = v0.clone().set_requires_grad(true);
    Tensor y = scaled_dot_product_attention(q, k, v);
    y.backward(dy);
    runs.push_back({bits_of(y), bits_of(q.grad()), bits_of(k.grad()), bits_of(v.grad())});
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(runs[0][0], runs[1][0]) << "out";
  EXPECT_EQ(runs[0][1], runs[1][1]) << "dq";
  EXPECT_EQ(runs[0][2], runs[1][2]) << "dk";
  EXPECT_EQ(runs[0][3], runs[1][3]) << "dv";
}

TEST(Attention, PartialGradientsMatchTheFullBackward) {
  // The kernel has three backward paths: dq alone, dk/dv alone, and all three in one pass.
  const Tensor q0 = randn_as({2, 4, 80, 16}, DType::F64, 80);
  const Tensor k0 = randn_as({2, 2, 96, 16}, DType::F64, 81);
  const Tensor v0 = randn_as({2, 2, 96, 16}, DType::F64, 82);
  const Tensor dy = randn_as({2, 4, 80, 16}, DType::F64, 83);
  auto grads = [&](bool need_q, bool need_kv) {
    Tensor q = q0.clone().set_requires_grad(need_q), k = k0.clone().set_requires_grad(need_kv),
           v = v0.clone().set_requires_grad(need_kv);
    scaled_dot_product_attention(q, k, v).backward(dy);
    return std::vector<Tensor>{q.grad(), k.grad(), v.grad()};
  };
  const auto all = grads(true, true);
  const auto only_q = grads(true, false);
  const auto only_kv = grads(false, true);
  EXPECT_TRUE(all_close(only_q[0], all[0], 1e-12, 1e-12));
  EXPECT_FALSE(only_q[1].defined());
  EXPECT_FALSE(only_kv[0].defined());
  EXPECT_TRUE(all_close(only_kv[1], all[1], 1e-12, 1e-12));
  EXPECT_TRUE(all_close(only_kv[2], all[2], 1e-12, 1e-12));
}

// The model passes transposed [B, T, H, D] activations, and the CPU kernels take them as they are
// (attention_takes_views_kernel): out and the gradients come back laid out [B, T, H, D], with
// bitwise the values of contiguous inputs, on each of the three backward paths (GQA, causal,
// several query and key blocks).
// With OpenBLAS's tile GEMMs the layout changes no bit. oneDNN (AVX-512 CPUs) picks its kernel by
// the operands' strides (BRGEMM for dense tiles, its jit GEMM for strided ones), which sum in
// other orders: there the results agree to f32 rounding.
TEST(Attention, TransposedViewsGiveTheContiguousResults) {
  const Tensor q0 = randn_as({2, 130, 4, 16}, DType::F32, 90);  // [B, T, H, D]
  const Tensor k0 = randn_as({2, 150, 2, 16}, DType::F32, 91);
  const Tensor v0 = randn_as({2, 150, 2, 16}, DType::F32, 92);
  const Tensor dy = randn_as({2, 130, 4, 16}, DType::F32, 93).transpose(1, 2);
  const bool saved = cpu::onednn_f32_gemm_enabled();
  std::vector<bool> onednn_paths = {false};
  if (__builtin_cpu_supports("avx512f")) onednn_paths.push_back(true);
  for (bool onednn : onednn_paths)
    for (auto [need_q, need_kv] : {std::pair{true, true}, {true, false}, {false, true}}) {
      SCOPED_TRACE(::testing::Message() << "onednn " << onednn << ", dq " << need_q
                                        << ", dk and dv " << need_kv);
      cpu::set_onednn_f32_gemm_enabled(onednn);
      std::vector<Tensor> results[2];
      for (bool views : {false, true}) {
        Tensor q = q0.clone().set_requires_grad(need_q),
               k = k0.clone().set_requires_grad(need_kv), v = v0.clone().set_requires_grad(need_kv);
        const auto bhtd = [views](const Tensor& t) {
          return views ? t.transpose(1, 2) : t.transpose(1, 2).contiguous();
        };
        Tensor y = scaled_dot_product_attention(bhtd(q), bhtd(k), bhtd(v));
        if (views) {
          EXPECT_TRUE(y.transpose(1, 2).is_contiguous()) << "out laid out [B, T, H, D]";
        }
        y.backward(views ? dy : dy.contiguous());
        results[views].push_back(y.contiguous());
        for (const Tensor& t : {q, k, v})
          if (t.requires_grad()) results[views].push_back(t.grad().contiguous());
      }
      ASSERT_EQ(results[0].size(), results[1].size());
      for (size_t i = 0; i < results[0].size(); ++i) {
        if (onednn) {
          EXPECT_TRUE(all_close(results[1][i], results[0][i], 1e-5, 1e-6)) << i;
        } else {
          EXPECT_EQ(bits_of(results[0][i]), bits_of(results[1][i])) << i;
        }
      }
    }
  cpu::set_onednn_f32_gemm_enabled(saved);
}

TEST(Attention, GradcheckThroughTransposedViews) {
  Tensor q = randn64({2, 70, 4, 3}, 94), k = randn64({2, 75, 2, 3}, 95),
         v = randn64({2, 75, 2, 2}, 96);
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0].transpose(1, 2), in[1].transpose(1, 2),
                                            in[2].transpose(1, 2), true);
      },
      {q, k, v});
  EXPECT_TRUE(r.ok) << r.message;
}

// Operands the view kernels cannot read in place are copied first: a gradient broadcast over the
// tokens (the loss averages the output over T: row stride 0, which BLAS refuses as a leading
// dimension, leaving stale tiles) and inputs expanded along T, S or the heads. In f64 (OpenBLAS)
// and f32 with oneDNN's GEMMs off, as on CPUs without AVX-512.
TEST(Attention, BroadcastGradientsAndInputsAreCopiedNotReadInPlace) {
  Tensor q = randn64({2, 6, 4, 3}, 97), k = randn64({2, 7, 2, 3}, 98),
         v = randn64({2, 7, 2, 3}, 99);
  for (bool causal : {true, false}) {
    auto r = autograd::gradcheck(
        [causal](const std::vector<Tensor>& in) {
          const Tensor y = scaled_dot_product_attention(
              in[0].transpose(1, 2), in[1].transpose(1, 2), in[2].transpose(1, 2), causal);
          return mean(y, {2});  // its backward expands the gradient over T
        },
        {q, k, v});
    EXPECT_TRUE(r.ok) << "causal " << causal << ": " << r.message;
  }
  const bool saved = cpu::onednn_f32_gemm_enabled();
  cpu::set_onednn_f32_gemm_enabled(false);
  for (DType dtype : {DType::F64, DType::F32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor q1 = randn_as({1, 4, 1, 8}, dtype, 100), k1 = randn_as({1, 1, 9, 8}, dtype, 101);
    const Tensor v0 = randn_as({1, 2, 9, 8}, dtype, 102);
    const Tensor qe = q1.expand({1, 4, 5, 8}), ke = k1.expand({1, 2, 9, 8});
    const Tensor expanded = scaled_dot_product_attention(qe, ke, v0, true);
    const Tensor copied =
        scaled_dot_product_attention(qe.contiguous(), ke.contiguous(), v0, true);
    EXPECT_EQ(expanded.to(DType::F64).to_vector<double>(),
              copied.to(DType::F64).to_vector<double>());
  }
  cpu::set_onednn_f32_gemm_enabled(saved);
}

TEST(Attention, F32GradientsMatchF64) {
  const Tensor q0 = randn_as({1, 4, 40, 8}, DType::F32, 80);
  const Tensor k0 = randn_as({1, 2, 70, 8}, DType::F32, 81);
  const Tensor v0 = randn_as({1, 2, 70, 8}, DType::F32, 82);
  const Tensor dy = randn_as({1, 4, 40, 8}, DType::F32, 83);
  std::vector<Tensor> grads[2];
  for (DType dt : {DType::F32, DType::F64}) {
    // clone(): fresh leaves (to() returns the tensor itself when the dtype already matches).
    Tensor q = q0.to(dt).clone().set_requires_grad(true),
           k = k0.to(dt).clone().set_requires_grad(true),
           v = v0.to(dt).clone().set_requires_grad(true);
    scaled_dot_product_attention(q, k, v).backward(dy.to(dt));
    grads[dt == DType::F64] = {q.grad(), k.grad(), v.grad()};
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(all_close(grads[0][i], grads[1][i], 1e-5, 1e-4)) << i;
}

// max |got - want| over max |want|, compared in f64.
double relative_max_error(const Tensor& got, const Tensor& want) {
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double err = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    err = std::max(err, std::abs(g[i] - w[i]));
    scale = std::max(scale, std::abs(w[i]));
  }
  return err / scale;
}

// bf16 inputs on each of the three backward paths (GQA, causal, several query and key blocks,
// transposed [B, T, H, D] views): the output and gradients against f64 math on the same bf16
// values, for the widening path (bf16 upcast to f32) and, on CPUs with AVX512_BF16, the native one
// (bf16 tile GEMMs with f32 softmax and accumulators; the probabilities and score gradients are
// rounded to bf16 for their GEMMs, as in flash attention). Both stay within 1.5 bf16 roundings
// (2^-8 = 0.0039) of the largest value (measured on a Zen 5: widened <= 0.0029, native <= 0.0039),
// bit-identical at 1 and 2 threads.
TEST(Attention, Bf16MatchesF64OnEachPath) {
  const Tensor q0 = randn_as({2, 130, 4, 32}, DType::BF16, 100);  // [B, T, H, D]
  const Tensor k0 = randn_as({2, 150, 2, 32}, DType::BF16, 101);
  const Tensor v0 = randn_as({2, 150, 2, 32}, DType::BF16, 102);
  const Tensor dy = randn_as({2, 130, 4, 32}, DType::BF16, 103).transpose(1, 2);
  const bool saved = cpu::onednn_bf16_gemm_enabled();
  std::vector<bool> native_paths = {false};
  if (__builtin_cpu_supports("avx512bf16")) native_paths.push_back(true);
  const int saved_threads = omp_get_max_threads();
  for (auto [need_q, need_kv] : {std::pair{true, true}, {true, false}, {false, true}}) {
    const auto run = [&](DType dtype) {
      Tensor q = q0.to(dtype).clone().set_requires_grad(need_q),
             k = k0.to(dtype).clone().set_requires_grad(need_kv),
             v = v0.to(dtype).clone().set_requires_grad(need_kv);
      Tensor y = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2));
      y.backward(dy.to(dtype));
      std::vector<Tensor> results = {y};
      for (const Tensor& t : {q, k, v})
        if (t.requires_grad()) results.push_back(t.grad());
      return results;
    };
    const std::vector<Tensor> want = run(DType::F64);
    for (bool native : native_paths) {
      SCOPED_TRACE(::testing::Message() << "native " << native << ", dq " << need_q
                                        << ", dk and dv " << need_kv);
      cpu::set_onednn_bf16_gemm_enabled(native);
      std::vector<std::vector<uint32_t>> bits[2];
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        const std::vector<Tensor> got = run(DType::BF16);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(got[i].dtype(), DType::BF16) << i;
          const double err = relative_max_error(got[i], want[i]);
          EXPECT_LT(err, 6e-3) << "result " << i << ", threads " << threads;
          bits[threads - 1].push_back(bits_of(got[i].to(DType::F32)));
        }
      }
      EXPECT_EQ(bits[0], bits[1]) << "bit-identical at 1 and 2 threads";
    }
  }
  omp_set_num_threads(saved_threads);
  cpu::set_onednn_bf16_gemm_enabled(saved);
}

TEST(Attention, Errors) {
  Tensor q = randn64({1, 3, 4, 8}, 1, false), k = randn64({1, 2, 4, 8}, 2, false),
         v = randn64({1, 2, 4, 8}, 3, false);
  try {
    scaled_dot_product_attention(q, k, v);  // 3 query heads, 2 kv heads
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("scaled_dot_product_attention"), std::string::npos) << msg;
    EXPECT_NE(msg.find("q [1, 3, 4, 8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("k [1, 2, 4, 8]"), std::string::npos) << msg;
  }
  Tensor q4 = randn64({1, 4, 4, 8}, 4, false);
  EXPECT_THROW(scaled_dot_product_attention(q4, randn64({1, 2, 4, 6}, 5, false), v), Error);  // D
  EXPECT_THROW(scaled_dot_product_attention(q4, k, randn64({1, 2, 5, 8}, 6, false)), Error);  // S
  EXPECT_THROW(scaled_dot_product_attention(q4, randn64({2, 2, 4, 8}, 7, false),
                                            randn64({2, 2, 4, 8}, 8, false)),
               Error);                                                              // batch
  EXPECT_THROW(scaled_dot_product_attention(q4.flatten(0, 1), k, v), Error);        // 3-D q
  EXPECT_THROW(scaled_dot_product_attention(q4.to(DType::F32), k, v), Error);       // dtype
  EXPECT_THROW(scaled_dot_product_attention(q4, k, v, true, std::nan("")), Error);  // scale
}

// Attention over keys held in blocks (context parallelism's ring): the blocks' outputs merged
// by logsumexp equal the whole attention, and the blocks' gradients given the whole out and lse
// add up to the op's (f64, to 1e-12). Causal: queries [4, 8) of 8 see keys [0, 4) fully and
// [4, 8) causally.
TEST(AttentionBlocks, MergedBlocksEqualTheWholeAttention) {
  const Tensor q = randn64({2, 4, 8, 8}, 41), k = randn64({2, 2, 8, 8}, 42),
               v = randn64({2, 2, 8, 8}, 43), w = randn64({2, 4, 4, 8}, 44, false);
  const Tensor whole = scaled_dot_product_attention(q, k, v, true);
  sum(mul(whole.narrow(2, 4, 4), w)).backward();
  const Tensor q2 = q.narrow(2, 4, 4).detach();
  const auto keys = [&](const Tensor& t, int64_t i) { return t.detach().narrow(2, 4 * i, 4); };
  AttentionBlock merged = attention_block_forward(q2, keys(k, 0), keys(v, 0), false);
  merge_attention_blocks(merged, attention_block_forward(q2, keys(k, 1), keys(v, 1), true));
  EXPECT_TRUE(all_close(merged.out, whole.narrow(2, 4, 4), 1e-12, 1e-12));
  const std::vector<Tensor> g0 =
      attention_block_backward(w, q2, keys(k, 0), keys(v, 0), merged, false);
  const std::vector<Tensor> g1 =
      attention_block_backward(w, q2, keys(k, 1), keys(v, 1), merged, true);
  EXPECT_TRUE(all_close(add(g0[0], g1[0]), q.grad().narrow(2, 4, 4), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(cat({g0[1], g1[1]}, 2), k.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(cat({g0[2], g1[2]}, 2), v.grad(), 1e-12, 1e-12));
  // Blocks of other queries do not merge.
  AttentionBlock other = attention_block_forward(q, k.detach(), v.detach(), true);
  EXPECT_THROW(merge_attention_blocks(other, merged), mt::Error);
}

}  // namespace
}  // namespace mt::runtime
