// vec_math's bf16 <-> f32 row conversions against bfloat16's own scalar conversions: every bf16
// value widened; narrowing at every bf16 value's neighbourhood (exact, just below, at and just
// above the rounding tie, both signs, subnormals, infinities, every NaN payload class) and a
// stride over all 2^32 bit patterns; lengths around the vector widths.
#include "runtime/cpu/vec_math.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/core/dtype.h"

namespace mt::runtime {
namespace {

TEST(VecMath, Bf16ToF32WidensEveryValueExactly) {
  std::vector<uint16_t> x(65536);
  for (uint32_t i = 0; i < 65536; ++i) x[i] = uint16_t(i);
  std::vector<float> y(x.size());
  cpu::row_bf16_to_f32(x.data(), int64_t(x.size()), y.data());
  for (uint32_t i = 0; i < 65536; ++i) {
    bfloat16 b;
    b.bits = uint16_t(i);
    ASSERT_EQ(__builtin_bit_cast(uint32_t, y[i]), __builtin_bit_cast(uint32_t, float(b)))
        << "bits " << i;
  }
}

TEST(VecMath, F32ToBf16RoundsLikeTheScalarConversion) {
  std::vector<uint32_t> patterns;
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      patterns.push_back(hi << 16 | lo);
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 65521) patterns.push_back(uint32_t(u));
  std::vector<float> x(patterns.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = __builtin_bit_cast(float, patterns[i]);
  std::vector<uint16_t> y(x.size());
  cpu::row_f32_to_bf16(x.data(), int64_t(x.size()), y.data());
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(y[i], bfloat16::from_float(x[i])) << std::hex << "f32 bits 0x" << patterns[i];
}

TEST(VecMath, ConversionsOfShortRowsTouchOnlyTheirElements) {
  for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 31, 33}) {
    std::vector<float> x(size_t(n) + 1, 1.5f), back(size_t(n) + 1, -7.0f);
    std::vector<uint16_t> y(size_t(n) + 1, 0xabcd);
    cpu::row_f32_to_bf16(x.data(), n, y.data());
    cpu::row_bf16_to_f32(y.data(), n, back.data());
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(back[size_t(j)], 1.5f) << n;
    EXPECT_EQ(y[size_t(n)], 0xabcd) << n;
    EXPECT_EQ(back[size_t(n)], -7.0f) << n;
  }
}

}  // namespace
}  // namespace mt::runtime
