// CUDA float8 kernels against the CPU reference: amax, scales and codes (both layouts) bit for
// bit, the hardware conversion against the reference's on every f32 neighbourhood of every code,
// the scaled FP8 GEMM (every operand-format pair, f32 and bf16 outputs, fast accumulation on and
// off) within f32 accumulation, and float8_linear's output and gradients; the same for the rowwise
// recipe (per-row scales rounded to powers of two, per-row GEMM scales), and float8_grouped_mm;
// the amaxes the norms and SwiGLU measure for the casts (Float8AmaxNotes). Skips without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "runtime/kernels/float8.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/float8.h"
#include "runtime/ops/float8_amax_notes.h"
#include "runtime/ops/float8_grouped.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/rms_norm.h"
#include "runtime/ops/swiglu.h"
#include "tests/testing/gpu_compare.h"

#if MT_HAVE_NCCL  // defined wherever the CUDA backend is built (parallel/CMakeLists.txt)
#include "runtime/cuda/context.h"
#include "runtime/cuda/float8_gemm.h"
#endif

namespace mt::runtime::gpu_test {
namespace {

class Float8Gpu : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    if (auto why = float8_gemm_unsupported_kernel(Device::cuda())) GTEST_SKIP() << *why;
  }
};

constexpr Float8Format kFormats[] = {Float8Format::E4M3, Float8Format::E5M2};

std::vector<uint8_t> bytes_of(const Tensor& codes) {
  const Tensor host = on_cpu(codes);
  const auto* p = static_cast<const uint8_t*>(host.data_ptr());
  return std::vector<uint8_t>(p, p + host.numel());
}

// Values spread over many binades (subnormal codes and saturation included once scaled), a few
// exact ties, zeros and negative zeros.
Tensor wide_values(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor x = rnd(shape, DType::F32, seed).contiguous();
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    p[i] = std::ldexp(p[i], int(i % 29) - 20);
    if (i % 97 == 0) p[i] = 0.0f;
    if (i % 101 == 0) p[i] = -0.0f;
  }
  return x.to(dtype);
}

TEST_F(Float8Gpu, CastsMatchTheCpuBitForBit) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (Float8Format f : kFormats) {
      // 37 x 53 and 1 x 1 take the one-element kernel, the others the eight-element one (72 x 200:
      // partial tiles both ways).
      for (const Shape& shape :
           {Shape{37, 53}, Shape{256, 2048}, Shape{4096, 48}, Shape{72, 200}, Shape{1, 1}}) {
        const Tensor x = wide_values(shape, dtype, 3);
        const Float8Tensor want = to_float8(x, f, true, true);
        const Float8Tensor got = to_float8(on_cuda(x), f, true, true);
        EXPECT_EQ(on_cpu(got.scale_inv).to_vector<float>(), want.scale_inv.to_vector<float>());
        EXPECT_EQ(bytes_of(got.codes), bytes_of(want.codes))
            << dtype_name(dtype) << " " << float8_format_name(f) << " " << str(shape);
        EXPECT_EQ(bytes_of(got.codes_t), bytes_of(want.codes_t))
            << dtype_name(dtype) << " " << float8_format_name(f) << " " << str(shape);
      }
    }
  }
}

// The hardware conversion against the reference's near every code: each code's value, its f32
// neighbours, and the midpoints to the next code (ties), with a scale of 1 (amax = max).
TEST_F(Float8Gpu, HardwareConversionMatchesTheReferenceAtEveryCode) {
  for (Float8Format f : kFormats) {
    std::vector<float> values;
    for (int c = 0; c < 256; ++c) {
      const float v = float8_to_float(uint8_t(c), f);
      if (!std::isfinite(v)) continue;
      values.push_back(v);
      values.push_back(std::nextafter(v, 1e9f));
      values.push_back(std::nextafter(v, -1e9f));
      const float next = float8_to_float(uint8_t(c + 1), f);
      if (c != 0x7f && c != 0xff && std::isfinite(next)) values.push_back((v + next) / 2);
    }
    // Within +-max, so that amax = max and the scale is exactly 1 (saturation: the test above).
    std::erase_if(values, [&](float v) { return std::abs(v) > float8_max(f); });
    const int64_t n = int64_t(values.size());
    const Tensor x = from_vector<float>(values, {1, n});
    const Float8Tensor want = to_float8(x, f, true, false);
    const Float8Tensor got = to_float8(on_cuda(x), f, true, false);
    ASSERT_EQ(want.scale_inv.to_vector<float>()[0], 1.0f);
    const std::vector<uint8_t> g = bytes_of(got.codes), w = bytes_of(want.codes);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(int(g[size_t(i)]), int(w[size_t(i)]))
          << float8_format_name(f) << " of " << values[size_t(i)];
    }
  }
}

TEST_F(Float8Gpu, NanPropagatesToTheScale) {
  Tensor x = rnd({64, 64}, DType::F32, 9).contiguous();
  x.data<float>()[100] = std::nanf("");
  const Float8Tensor got = to_float8(on_cuda(x), Float8Format::E4M3, true, false);
  EXPECT_TRUE(std::isnan(on_cpu(got.scale_inv).to_vector<float>()[0]));
}

// Float8AmaxNotes on the device: rms_norm's, swiglu's and cross_entropy's kernels measure the
// amax of what they write (forward; swiglu's two input gradients, the logits' gradient), bit for
// bit the float8_amax kernel's on the same values: rows of a warp, of several warps and past the
// registers (the block path), packs and single elements (an odd feature count, a misaligned
// view), a tail, zeros, subnormals and a NaN. Needs no FP8 tensor cores.
using Float8AmaxNotesGpu = GpuTest;

uint32_t f32_bits(float v) {
  uint32_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

uint32_t cast_amax_bits(const Tensor& t) {  // the cast's own pass, on t's device
  Tensor amax = Tensor::empty({1}, TensorOptions{}.with_device(t.device()));
  float8_amax_kernel(t.device(), t.contiguous(), amax);
  return f32_bits(on_cpu(amax).item<float>());
}

void expect_noted_as_measured(const Tensor& t, const std::string& what) {
  const Tensor noted = noted_float8_amax(t);
  ASSERT_TRUE(noted.defined()) << what;
  EXPECT_EQ(f32_bits(on_cpu(noted).item<float>()), cast_amax_bits(t)) << what;
}

TEST_F(Float8AmaxNotesGpu, NormsAndSwigluMeasureWhatTheyWriteBitForBit) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t d : {64, 45, 4104, 40000}) {
      // 1000 rows: many blocks (and several rows a block for small d) raise one slot.
      for (int64_t rows : {int64_t(5), d <= 4104 ? int64_t(1000) : int64_t(7)}) {
        const std::string what = std::string(dtype_name(dtype)) + " rms_norm, " +
                                 std::to_string(rows) + " x " + std::to_string(d);
        Tensor x = wide_values({rows, d}, DType::F32, uint64_t(d));
        if (d == 45) x.data<float>()[2 * d + 7] = std::nanf("");
        const Tensor xd = on_cuda(x.to(dtype)), w = on_cuda(rnd({d}, dtype, 3));
        Float8AmaxNotes notes;
        expect_noted_as_measured(rms_norm(xd, w), what);
      }
    }
    for (int64_t n : {int64_t(8000), int64_t(8003), (int64_t(1) << 20) + 3}) {
      for (int64_t offset : {0, 1}) {  // 1: a misaligned start, one element at a time
        const std::string what = std::string(dtype_name(dtype)) + " swiglu, n " +
                                 std::to_string(n) + ", offset " + std::to_string(offset);
        const Tensor gate = on_cuda(wide_values({n + 1}, DType::F32, 5).to(dtype))
                                .narrow(0, offset, n)
                                .set_requires_grad(true);
        const Tensor up =
            on_cuda(rnd({n + 1}, dtype, 6)).narrow(0, offset, n).set_requires_grad(true);
        Float8AmaxNotes notes;
        std::vector<Tensor> grads;
        for (const Tensor& leaf : {gate, up}) {
          leaf.register_hook([&grads](const Tensor& g) {
            grads.push_back(g);
            return g;
          });
        }
        const Tensor out = swiglu(gate, up);
        expect_noted_as_measured(out, what + " forward");
        sum(mul(out, on_cuda(wide_values({n}, DType::F32, 7).to(dtype)))).backward();
        ASSERT_EQ(grads.size(), 2u) << what;
        expect_noted_as_measured(grads[0], what + " dgate");
        expect_noted_as_measured(grads[1], what + " dup");
      }
    }
    {  // A backward that writes dgate alone (up needs no gradient).
      const std::string what = std::string(dtype_name(dtype)) + " swiglu, dgate alone";
      const Tensor gate =
          on_cuda(wide_values({8000}, DType::F32, 9).to(dtype)).set_requires_grad(true);
      const Tensor up = on_cuda(rnd({8000}, dtype, 10));
      Float8AmaxNotes notes;
      std::vector<Tensor> grads;
      gate.register_hook([&grads](const Tensor& g) {
        grads.push_back(g);
        return g;
      });
      sum(mul(swiglu(gate, up), on_cuda(wide_values({8000}, DType::F32, 11).to(dtype)))).backward();
      ASSERT_EQ(grads.size(), 1u) << what;
      expect_noted_as_measured(grads[0], what);
    }
    for (int64_t v : {4096, 1001}) {  // cross_entropy's logits gradient: packs, single elements
      const std::string what =
          std::string(dtype_name(dtype)) + " cross_entropy, V " + std::to_string(v);
      const Tensor logits = on_cuda(rnd({6, v}, dtype, 8)).set_requires_grad(true);
      std::vector<int64_t> ids = {3, 0, -100, v - 1, 17, 3};  // one row ignored
      const Tensor targets =
          on_cuda(from_vector<int64_t>(ids, {6}, TensorOptions{}.with_dtype(DType::I64)));
      Float8AmaxNotes notes;
      std::vector<Tensor> grads;
      logits.register_hook([&grads](const Tensor& g) {
        grads.push_back(g);
        return g;
      });
      cross_entropy(logits, targets, -100, Reduction::Mean, DType::F32).backward();
      ASSERT_EQ(grads.size(), 1u) << what;
      expect_noted_as_measured(grads[0], what);
    }
  }
}

double relative_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = on_cpu(got).to_vector<double>(), w = want.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    num += (g[i] - w[i]) * (g[i] - w[i]);
    den += w[i] * w[i];
  }
  return std::sqrt(num / den);
}

// Hopper's FP8 tensor cores do not accumulate in full f32: against the CPU's f32 sums, an f32
// output was 1.0-1.3e-4 off (relative Frobenius norm), 4.4-8.6e-4 with fast accumulation (H200,
// 2026-11-27, K up to 2048); bf16 outputs are bounded by bf16's rounding.
double gemm_tolerance(DType out, bool fast_accum) {
  if (out == DType::BF16) return 4e-3;
  return fast_accum ? 2e-3 : 3e-4;
}

// op(inputs) on the CPU and on CUDA, backpropagated from sum(y * r): y and every input's
// gradient within the GEMMs' tolerance of the CPU's (y's GEMM accumulates fast, as torchao's
// forward; the gradients' do not), in the inputs' dtype.
void expect_op_and_gradients_match_cpu(
    const std::vector<Tensor>& inputs, const Tensor& r,
    const std::function<Tensor(const std::vector<Tensor>&)>& op) {
  const DType dtype = inputs.front().dtype();
  std::vector<Tensor> outs[2];
  for (int d = 0; d < 2; ++d) {
    const std::vector<Tensor> in = to_device(inputs, d == 0 ? Device::cpu() : Device::cuda(), true);
    const Tensor y = op(in);
    sum(mul(y, d == 0 ? r : on_cuda(r))).backward();
    outs[d] = {y};
    for (const Tensor& t : in) outs[d].push_back(t.grad());
  }
  for (size_t i = 0; i < outs[0].size(); ++i) {
    const double tol = dtype == DType::BF16 ? 8e-3 : gemm_tolerance(DType::F32, i == 0);
    EXPECT_EQ(outs[1][i].dtype(), dtype);
    EXPECT_LT(testing::relative_error(outs[1][i], outs[0][i].to(DType::F64)), tol)
        << dtype_name(dtype) << " output " << i << " (y, then the inputs' gradients)";
  }
}

TEST_F(Float8Gpu, GemmMatchesTheCpuReference) {
  struct Case {
    int64_t m, n, k;
  };
  const std::pair<Float8Format, Float8Format> pairs[] = {{Float8Format::E4M3, Float8Format::E4M3},
                                                         {Float8Format::E5M2, Float8Format::E4M3},
                                                         {Float8Format::E4M3, Float8Format::E5M2}};
  for (const Case& c : {Case{64, 48, 32}, Case{256, 512, 1024}, Case{8192, 512, 2048}}) {
    for (const auto& [fa, fb] : pairs) {
      const Float8Tensor a = to_float8(rnd({c.m, c.k}, DType::F32, 1), fa, true, false);
      const Float8Tensor b = to_float8(rnd({c.n, c.k}, DType::F32, 2), fb, true, false);
      for (DType out : {DType::F32, DType::BF16}) {
        for (bool fast : {false, true}) {
          const Tensor want =
              float8_mm(a.codes, fa, a.scale_inv, b.codes, fb, b.scale_inv, out, fast);
          const Tensor got = float8_mm(on_cuda(a.codes), fa, on_cuda(a.scale_inv), on_cuda(b.codes),
                                       fb, on_cuda(b.scale_inv), out, fast);
          EXPECT_EQ(got.dtype(), out);
          EXPECT_LT(relative_error(got, want), gemm_tolerance(out, fast))
              << c.m << "x" << c.n << "x" << c.k << " " << float8_format_name(fa) << "/"
              << float8_format_name(fb) << " " << dtype_name(out) << (fast ? " fast" : "");
        }
      }
    }
  }
}

TEST_F(Float8Gpu, LinearAndItsGradientsMatchTheCpu) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor x = rnd({4, 64, 256}, dtype, 11), w = rnd({512, 256}, dtype, 12);
    const Tensor b = rnd({512}, dtype, 13), r = rnd({4, 64, 512}, dtype, 14);
    expect_op_and_gradients_match_cpu({x, w, b}, r, [](const std::vector<Tensor>& in) {
      return float8_linear(in[0], in[1], in[2]);
    });
  }
}

TEST_F(Float8Gpu, RowwiseCastsMatchTheCpuBitForBit) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (bool pow2 : {true, false}) {
      for (const Shape& shape : {Shape{37, 53}, Shape{256, 2048}, Shape{1, 1}, Shape{3, 5000}}) {
        const Tensor x = wide_values(shape, dtype, 5);
        const Float8Tensor want = to_float8_rowwise(x, Float8Format::E4M3, pow2);
        const Float8Tensor got = to_float8_rowwise(on_cuda(x), Float8Format::E4M3, pow2);
        EXPECT_EQ(on_cpu(got.scale_inv).to_vector<float>(), want.scale_inv.to_vector<float>())
            << dtype_name(dtype) << (pow2 ? " pow2 " : " ") << str(shape);
        EXPECT_EQ(bytes_of(got.codes), bytes_of(want.codes))
            << dtype_name(dtype) << (pow2 ? " pow2 " : " ") << str(shape);
      }
    }
  }
}

// A transposed view (W by input feature, dy and x by feature over the tokens) is cast by column
// in place on the GPU (float8_colwise_cast: no transposing copy): the same scales and codes as
// the CPU's cast of its contiguous copy, with its own column amaxes, given ones (a tp reduction's)
// and float8_row_amax of the view; also a view of a row slice (one MoE expert's tokens).
TEST_F(Float8Gpu, TransposedViewsCastByColumnInPlaceBitForBit) {
  // A columnwise kernel that differed from the copy at its first call would be replaced by the
  // copy's result (and said on stderr), so the comparisons below would pass on the copy alone.
  ::testing::internal::CaptureStderr();
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (bool pow2 : {true, false}) {
      for (const Shape& shape : {Shape{37, 53}, Shape{2048, 256}, Shape{5000, 3}, Shape{64, 1}}) {
        const std::string what =
            std::string(dtype_name(dtype)) + (pow2 ? " pow2 " : " ") + str(shape);
        const Tensor x = wide_values(shape, dtype, 6);
        const Tensor xt = x.transpose(0, 1), xt_gpu = on_cuda(x).transpose(0, 1);
        const Float8Tensor want = to_float8_rowwise(xt, Float8Format::E4M3, pow2);
        const Float8Tensor got = to_float8_rowwise(xt_gpu, Float8Format::E4M3, pow2);
        EXPECT_EQ(on_cpu(got.scale_inv).to_vector<float>(), want.scale_inv.to_vector<float>())
            << what;
        EXPECT_EQ(bytes_of(got.codes), bytes_of(want.codes)) << what;
        const Tensor amax = float8_row_amax(xt), amax_gpu = float8_row_amax(xt_gpu);
        EXPECT_EQ(on_cpu(amax_gpu).to_vector<float>(), amax.to_vector<float>()) << what;
        // Given amaxes (twice each column's own): the scales follow them.
        const Tensor given = runtime::mul(amax, 2.0);
        const Float8Tensor want_given =
            to_float8_rowwise_with_amax(xt, Float8Format::E4M3, pow2, given);
        const Float8Tensor got_given =
            to_float8_rowwise_with_amax(xt_gpu, Float8Format::E4M3, pow2, on_cuda(given));
        EXPECT_EQ(bytes_of(got_given.codes), bytes_of(want_given.codes)) << what << " given";
        EXPECT_EQ(on_cpu(got_given.scale_inv).to_vector<float>(),
                  want_given.scale_inv.to_vector<float>())
            << what << " given";
      }
    }
  }
  const Tensor x = wide_values({96, 48}, DType::BF16, 7);
  const Tensor slice = x.narrow(0, 32, 48).transpose(0, 1);  // [48, 48]: rows 32..79 by column
  const Tensor slice_gpu = on_cuda(x).narrow(0, 32, 48).transpose(0, 1);
  EXPECT_EQ(bytes_of(to_float8_rowwise(slice_gpu, Float8Format::E4M3, true).codes),
            bytes_of(to_float8_rowwise(slice, Float8Format::E4M3, true).codes));
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              ::testing::Not(::testing::HasSubstr("differs")));
}

// On Hopper, rowwise GEMMs apply their row and column scales in cuBLASLt's epilogue (the
// outer-vector scale mode: one kernel, no f32 sums in memory) for every output dtype and
// accumulation the recipe uses: the mode exists in the cuBLASLt the build ships and gave the exact
// answer on the check GEMM. Without it they still match the CPU (the test below), only slower.
TEST_F(Float8Gpu, RowwiseScalesApplyInTheGemmEpilogueOnHopper) {
#if MT_HAVE_NCCL
  const cudaDeviceProp& props = cuda::device_properties(cuda::current_device());
  // cuBLASLt has the mode on sm_90 alone (NVIDIA's CUDALibrarySamples#270; PyTorch #160693).
  if (props.major != 9) GTEST_SKIP() << props.name << ": outer-vector scales are Hopper's (sm_90)";
  ::testing::internal::CaptureStderr();
  for (DType out : {DType::F32, DType::BF16}) {
    for (bool fast : {false, true}) {
      EXPECT_TRUE(cuda::float8_rowwise_scales_in_epilogue(Float8Format::E4M3, Float8Format::E4M3,
                                                          out, fast))
          << dtype_name(out) << (fast ? " fast" : "");
    }
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(said, "");
#else
  GTEST_SKIP() << "this build has no CUDA backend";
#endif
}

TEST_F(Float8Gpu, RowwiseGemmAndLinearMatchTheCpu) {
  const Float8Tensor a =
      to_float8_rowwise(rnd({256, 512}, DType::F32, 1), Float8Format::E4M3, true);
  const Float8Tensor b =
      to_float8_rowwise(rnd({128, 512}, DType::F32, 2), Float8Format::E4M3, true);
  for (DType out : {DType::F32, DType::BF16}) {
    for (bool fast : {false, true}) {
      const Tensor want =
          float8_mm(a.codes, a.format, a.scale_inv, b.codes, b.format, b.scale_inv, out, fast);
      // Twice: the first call also runs the check GEMM that decides whether cuBLASLt's epilogue
      // applies the scales; the second runs what was decided.
      for (int call = 0; call < 2; ++call) {
        const Tensor got = float8_mm(on_cuda(a.codes), a.format, on_cuda(a.scale_inv),
                                     on_cuda(b.codes), b.format, on_cuda(b.scale_inv), out, fast);
        EXPECT_LT(relative_error(got, want), gemm_tolerance(out, fast))
            << dtype_name(out) << (fast ? " fast" : "") << " call " << call;
      }
    }
  }
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor x = rnd({4, 64, 256}, dtype, 11), w = rnd({512, 256}, dtype, 12);
    const Tensor r = rnd({4, 64, 512}, dtype, 14);
    expect_op_and_gradients_match_cpu({x, w}, r, [](const std::vector<Tensor>& in) {
      return float8_linear(in[0], in[1], Tensor(), Float8Recipe::Rowwise);
    });
  }
}

// The float8 grouped GEMM (MoE experts): the forward and both gradients against the CPU
// reference, with groups of uneven sizes (padded to multiples of 16) and an empty one.
TEST_F(Float8Gpu, GroupedMmAndItsGradientsMatchTheCpu) {
  const std::vector<int64_t> counts{37, 0, 64, 27};
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor x = rnd({128, 256}, dtype, 21), w = rnd({4, 512, 256}, dtype, 22);
    const Tensor r = rnd({128, 512}, dtype, 23);
    expect_op_and_gradients_match_cpu({x, w}, r, [&](const std::vector<Tensor>& in) {
      return float8_grouped_mm(in[0], in[1], counts);
    });
    // Two weights reading x in one call (x cast once), as the MoE experts run w1 and w3.
    const Tensor w3 = rnd({4, 512, 256}, dtype, 24);
    expect_op_and_gradients_match_cpu({x, w, w3}, r, [&](const std::vector<Tensor>& in) {
      const std::vector<Tensor> y = float8_grouped_mm(in[0], {in[1], in[2]}, counts);
      return add(y[0], y[1]);
    });
  }
}

}  // namespace
}  // namespace mt::runtime::gpu_test
