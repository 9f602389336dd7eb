// Float8AmaxNotes (runtime/ops/float8_amax_notes.h) on the CPU: rms_norm's and swiglu's outputs,
// swiglu's input gradients and cross_entropy's logits gradient carry the amax the tensorwise cast
// would measure, bit for bit (NaN included); a Llama-style FFN and output projection of float8
// linears give the same loss and gradients with the notes as without, with the casts' own amax
// passes over those tensors gone; a tensor changed since, another view, a reduced amax, f64 and
// code outside a scope get no note or leave it be.
#include "runtime/ops/float8_amax_notes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/profiler.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/float8.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/rms_norm.h"
#include "runtime/ops/swiglu.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::randn_as;

uint32_t bits_of(float v) {
  uint32_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// max |value| of t as the casts define it: the largest |bits| (a NaN's are the largest).
uint32_t amax_bits(const Tensor& t) {
  uint32_t best = 0;
  for (float v : t.to(DType::F32).to_vector<float>())
    best = std::max(best, bits_of(v) & 0x7fffffffu);
  return best;
}

// FP8 codes (Bool-dtype bytes holding any of the 256 codes) as bytes.
std::vector<uint8_t> code_bytes(const Tensor& codes) {
  const auto* p = static_cast<const uint8_t*>(codes.data_ptr());
  return {p, p + codes.numel()};
}

uint32_t noted_bits(const Tensor& t) {
  const Tensor amax = noted_float8_amax(t);
  EXPECT_TRUE(amax.defined()) << "no amax noted";
  return amax.defined() ? bits_of(amax.item<float>()) : 0;
}

TEST(Float8AmaxNotes, NormsAndSwigluNoteTheAmaxOfWhatTheyWrite) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = randn_as({6, 48}, dtype, 1, "x");
    const Tensor w = randn_as({48}, dtype, 2, "w");
    const Tensor gate = randn_as({6, 40}, dtype, 3, "gate").set_requires_grad(true);
    const Tensor up = randn_as({6, 40}, dtype, 4, "up").set_requires_grad(true);
    Float8AmaxNotes notes;
    const Tensor y = rms_norm(x, w);
    EXPECT_EQ(noted_bits(y), amax_bits(y));
    EXPECT_EQ(noted_bits(y.reshape({3, 96})), amax_bits(y)) << "a view of the same elements";
    const Tensor s = swiglu(gate, up);
    EXPECT_EQ(noted_bits(s), amax_bits(s));
    // The gradients swiglu's backward writes (gate's and up's), as hooks see them.
    std::vector<Tensor> grads;
    for (const Tensor& leaf : {gate, up}) {
      leaf.register_hook([&grads](const Tensor& g) {
        grads.push_back(g);
        return g;
      });
    }
    sum(mul(swiglu(gate, up), randn_as({6, 40}, dtype, 5, "r"))).backward();
    ASSERT_EQ(grads.size(), 2u);
    for (const Tensor& g : grads) EXPECT_EQ(noted_bits(g), amax_bits(g));
    // A NaN anywhere is the amax, as in the cast's own pass.
    x.narrow(0, 2, 1).narrow(1, 7, 1).fill_(std::numeric_limits<double>::quiet_NaN());
    const Tensor y_nan = rms_norm(x, w);
    EXPECT_TRUE(std::isnan(noted_float8_amax(y_nan).item<float>()));
    EXPECT_EQ(noted_bits(y_nan), amax_bits(y_nan));
  }
}

// A step of a large model takes more slots than one pool holds (about 8 a layer): the slots of a
// replaced pool keep their notes.
TEST(Float8AmaxNotes, NotesOutlastTheSlotPoolTheyCameFrom) {
  const Tensor x = randn_as({4, 32}, DType::BF16, 1, "x");
  const Tensor w = randn_as({32}, DType::BF16, 2, "w");
  Float8AmaxNotes notes;
  std::vector<Tensor> outputs;
  for (int i = 0; i < 600; ++i) outputs.push_back(rms_norm(x, mul(w, 1.0 + i / 8.0)));
  for (size_t i : {size_t(0), size_t(255), size_t(256), size_t(511), size_t(512), size_t(599)}) {
    EXPECT_EQ(noted_bits(outputs[i]), amax_bits(outputs[i])) << "note " << i;
  }
  EXPECT_NE(noted_bits(outputs[0]), noted_bits(outputs[599]));
}

// A Llama FFN block of tensorwise float8 linears, then a float8 output projection and the loss:
// rms_norm -> w1, w3 (one shared input cast) -> swiglu -> w2 -> output -> cross_entropy. With the
// notes, the casts of the norm's and swiglu's outputs (forward) and of the logits' and w1's and
// w3's output gradients (backward) take the noted amaxes: 5 of the step's 11 amax passes are
// gone, and the loss and every gradient are the same bit for bit.
TEST(Float8AmaxNotes, FloatEightFfnGivesTheSameResultsWithFewerAmaxPasses) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    struct Run {
      std::vector<std::vector<float>> values;  // the output, then every gradient
      int64_t amax_passes = 0;
    };
    const auto run = [&](bool notes) {
      const Tensor x = randn_as({2, 16, 32}, dtype, 11, "x").set_requires_grad(true);
      const Tensor norm = randn_as({32}, dtype, 12, "norm").set_requires_grad(true);
      const Tensor w1 = randn_as({48, 32}, dtype, 13, "w1").set_requires_grad(true);
      const Tensor w3 = randn_as({48, 32}, dtype, 14, "w3").set_requires_grad(true);
      const Tensor w2 = randn_as({32, 48}, dtype, 15, "w2").set_requires_grad(true);
      const Tensor w_out = randn_as({64, 32}, dtype, 16, "output").set_requires_grad(true);
      std::vector<int64_t> ids(32);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 37 % 64);
      ids[5] = -100;  // ignored: a zero row of the logits' gradient
      const Tensor targets = from_vector<int64_t>(ids, {32}, TensorOptions{}.with_dtype(DType::I64));
      Run out;
      Profiler::start(Device::cpu());
      Tensor loss;
      {
        std::optional<Float8AmaxNotes> scope;
        if (notes) scope.emplace();
        const Tensor h = rms_norm(x, norm);
        Tensor gate, up;
        {
          Float8InputCastSharing share;
          gate = float8_linear(h, w1);
          up = float8_linear(h, w3);
        }
        const Tensor y = float8_linear(swiglu(gate, up), w2);
        const Tensor logits = float8_linear(y, w_out).reshape({32, 64});
        loss = cross_entropy(logits, targets, -100, Reduction::Mean, DType::F32);
        loss.backward();
      }
      for (const ProfiledOp& op : Profiler::stop().ops)
        out.amax_passes += op.name == std::string("float8_amax");
      for (const Tensor& t :
           {loss, x.grad(), norm.grad(), w1.grad(), w3.grad(), w2.grad(), w_out.grad()})
        out.values.push_back(t.to(DType::F32).to_vector<float>());
      return out;
    };
    const Run without = run(false), with = run(true);
    // Forward: h (once, shared), w1, w3, swiglu's output, w2, y, output; backward: the four
    // output gradients. The notes cover h, swiglu's output and the logits', w1's and w3's output
    // gradients.
    EXPECT_EQ(without.amax_passes, 11);
    EXPECT_EQ(with.amax_passes, 6);
    ASSERT_EQ(with.values.size(), without.values.size());
    for (size_t i = 0; i < with.values.size(); ++i) {
      EXPECT_EQ(with.values[i], without.values[i]) << "value " << i;
    }
  }
}

// Notes are only for the elements measured, as they were: another view of the storage, a tensor
// changed in place since, an f64 output or an op outside a scope get none; a cast whose amax is
// reduced (tensor parallelism) reduces a copy, leaving the note as it was; an inner scope's notes
// end with it.
TEST(Float8AmaxNotes, OtherElementsChangedTensorsAndReductionsAreMeasuredAfresh) {
  const Tensor x = randn_as({8, 32}, DType::F32, 21, "x");
  const Tensor w = randn_as({32}, DType::F32, 22, "w");
  EXPECT_FALSE(noted_float8_amax(rms_norm(x, w)).defined()) << "outside a scope";
  Float8AmaxNotes notes;
  Tensor y = rms_norm(x, w);
  const uint32_t measured = amax_bits(y);
  EXPECT_EQ(noted_bits(y), measured);
  EXPECT_FALSE(noted_float8_amax(y.narrow(0, 0, 4)).defined()) << "half the rows";
  EXPECT_FALSE(noted_float8_amax(y.narrow(0, 4, 4)).defined()) << "the other half";
  EXPECT_FALSE(noted_float8_amax(y.transpose(0, 1)).defined()) << "not contiguous";
  EXPECT_FALSE(noted_float8_amax(rms_norm(x.to(DType::F64), w.to(DType::F64))).defined());

  int64_t reductions = 0;
  const Float8AmaxReduce doubled = [&](Tensor& amax) {
    ++reductions;
    mul_(amax, 2.0);
  };
  const Float8Tensor reduced = to_float8(y, Float8Format::E4M3, true, false, doubled);
  EXPECT_EQ(reductions, 1);
  EXPECT_EQ(noted_bits(y), measured) << "the reduction changed the note";
  EXPECT_EQ(code_bytes(reduced.codes),
            code_bytes(to_float8(y.clone(), Float8Format::E4M3, true, false, doubled).codes));

  mul_(y, 4.0);
  EXPECT_FALSE(noted_float8_amax(y).defined()) << "changed in place since";
  Tensor inner;
  {
    Float8AmaxNotes nested;
    inner = rms_norm(x, w);
    EXPECT_TRUE(noted_float8_amax(inner).defined());
  }
  EXPECT_FALSE(noted_float8_amax(inner).defined()) << "the inner scope's note outlived it";
}

}  // namespace
}  // namespace mt::runtime
