#include "runtime/core/dtype.h"

#include <array>

namespace mt::runtime {

float16::operator float() const {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float16::from_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;          // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;         // overflow (rounds to >= 65520) -> inf
  if (abs < 0x33000001u) return sign;                    // underflow to zero
  int exp = int(abs >> 23) - 127 + 15;
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  if (exp <= 0) {  // subnormal half
    const int shift = 14 - exp;  // 24-bit mantissa down to 10 bits minus exponent deficit
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return sign | uint16_t(half);
  }
  uint32_t half = (uint32_t(exp) << 10) | ((mant >> 13) & 0x3ffu);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: fine
  return sign | uint16_t(half);
}

namespace {
struct Info {
  std::string_view name;
  size_t size;
};
constexpr std::array<Info, kNumDTypes> kInfo = {{
    {"f32", 4}, {"bf16", 2}, {"f16", 2}, {"f64", 8}, {"i32", 4}, {"i64", 8}, {"bool", 1}}};
}  // namespace

size_t dtype_size(DType t) { return kInfo[size_t(t)].size; }
std::string_view dtype_name(DType t) { return kInfo[size_t(t)].name; }

DType dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (kInfo[i].name == name) return DType(i);
  if (name == "float32" || name == "float") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  if (name == "float16" || name == "half") return DType::F16;
  if (name == "float64" || name == "double") return DType::F64;
  if (name == "int32") return DType::I32;
  if (name == "int64") return DType::I64;
  MT_FAIL("unknown dtype '", name, "'; valid: f32, bf16, f16, f64, i32, i64, bool");
}

bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16;
}
bool is_integral(DType t) { return t == DType::I32 || t == DType::I64; }
std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

}  // namespace mt::runtime
