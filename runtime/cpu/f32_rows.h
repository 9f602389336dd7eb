// How a CPU kernel runs f32 and bf16 rows through the f32 row helpers of vec_math.h: a bf16 row is
// widened into a caller-owned f32 buffer, and an output row is computed into one and rounded once
// into the bf16 destination (store_row); f32 rows are used in place.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/cpu/vec_math.h"

namespace mt::runtime::cpu {

// Whether T's rows go through the f32 row helpers (f32, bf16) rather than generic loops (f64).
template <class T>
inline constexpr bool kF32Rows = std::is_same_v<T, float> || std::is_same_v<T, bfloat16>;

// A buffer for one widened row of n elements of T (empty for f32, whose rows need none).
template <class T>
std::vector<float> row_buffer(int64_t n) {
  return std::vector<float>(std::is_same_v<T, bfloat16> ? size_t(n) : 0);
}

// The n elements at x as f32: x itself, or widened into buffer.
template <class T>
const float* f32_row(const T* x, int64_t n, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    row_bf16_to_f32(&x->bits, n, buffer.data());
    return buffer.data();
  }
}

// Where to compute an output row destined for y: y itself, or buffer (then store_row).
template <class T>
float* f32_out(T* y, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return y;
  } else {
    return buffer.data();
  }
}

// Rounds a row computed by f32_out's buffer into y (nothing to do for f32).
template <class T>
void store_row(const float* row, int64_t n, T* y) {
  if constexpr (std::is_same_v<T, bfloat16>) row_f32_to_bf16(row, n, &y->bits);
}

}  // namespace mt::runtime::cpu
