// Element types of tensors: f32, bf16, f16, f64, i32, i64, bool.
//
// bf16 and f16 are stored as 16-bit values and computed in f32 (round-to-nearest-even on store).
// `dispatch_dtype` maps a runtime DType to a C++ type for kernel templates.
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string_view>

#include "runtime/core/error.h"

namespace mt::runtime {

enum class DType : uint8_t { F32, BF16, F16, F64, I32, I64, Bool };
inline constexpr int kNumDTypes = 7;

// 16-bit float storage types. Conversions round to nearest even; NaN stays NaN.
struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  bfloat16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a float type
  operator float() const {                     // NOLINT
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
};

struct float16 {
  uint16_t bits = 0;
  float16() = default;
  float16(float f) : bits(from_float(f)) {}  // NOLINT
  operator float() const;                     // NOLINT
  static uint16_t from_float(float f);
};

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", ...
DType dtype_from_name(std::string_view name);  // throws naming the valid names
bool is_floating(DType t);
bool is_integral(DType t);  // i32, i64 (not bool)
// Where floating math on t accumulates: f64 for f64, f32 otherwise (16-bit floats included).
inline DType accumulation_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }
std::ostream& operator<<(std::ostream& os, DType t);

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<float16> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

// The type arithmetic is done in: f32 for the 16-bit floats, the type itself otherwise.
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<bfloat16> { using type = float; };
template <> struct compute_type<float16> { using type = float; };
template <class T> using compute_t = typename compute_type<T>::type;

// Calls fn(T{}) with T the C++ type of `t`. Unlisted dtypes throw naming `op`.
template <class Fn>
decltype(auto) dispatch_dtype(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn(float{});
    case DType::F64: return fn(double{});
    case DType::BF16: return fn(bfloat16{});
    case DType::F16: return fn(float16{});
    case DType::I32: return fn(int32_t{});
    case DType::I64: return fn(int64_t{});
    case DType::Bool: return fn(bool{});
  }
  MT_FAIL(op, ": unknown dtype");
}

// As dispatch_dtype, for the floating dtypes only.
template <class Fn>
decltype(auto) dispatch_floating(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn(float{});
    case DType::F64: return fn(double{});
    case DType::BF16: return fn(bfloat16{});
    case DType::F16: return fn(float16{});
    default: break;
  }
  MT_FAIL(op, ": expected a floating dtype (f32, f64, bf16, f16), got ", dtype_name(t));
}

}  // namespace mt::runtime
