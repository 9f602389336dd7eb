// Vectorised f32 math for CPU row kernels (softmax, cross-entropy, SwiGLU), and the bf16 <-> f32
// row conversions through which bf16 kernels use them.
//
// exp_f32 is a branch-free polynomial exp (Cephes' expf: range reduction by ln 2, degree-6
// polynomial) within 2 ulp of the correctly rounded value for normal results; exp(-inf) = 0,
// exp(+inf) = +inf and NaN stays NaN. std::exp does not vectorise without -ffast-math; exp_f32
// does inside `#pragma omp simd` loops compiled without trapping math, which is how the row
// helpers below are built (vec_math.cpp), as a baseline, an AVX2+FMA and an AVX-512 clone picked at
// load time (target_clones). Their sums run in a fixed vector order: results do not depend on the
// thread count (they may differ in the last bits between machines with and without AVX2).
#pragma once

#include <cstdint>

#include "runtime/kernels/optim_update.h"

namespace mt::runtime::cpu {

[[gnu::always_inline]] inline float exp_f32(float x) {
  // Clamping to [-104, 89] keeps 2^n representable as two factors while the product still
  // underflows to exactly 0 (x <= -104) or overflows to +inf (x > log(FLT_MAX)). The operand
  // order lets NaN through both clamps (and hence to the result). Everything is a select or
  // arithmetic, which vectorises once trapping math is off (see vec_math.cpp).
  constexpr float kHi = 89.0f, kLo = -104.0f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float xc = x < kLo ? kLo : x;
  xc = xc > kHi ? kHi : xc;
  const float t = xc * 1.44269504088896341f + kRound;
  const float fn = t - kRound;  // n = round(x / ln 2), as a float and as an int
  const int32_t n = __builtin_bit_cast(int32_t, t) - __builtin_bit_cast(int32_t, kRound);
  float r = xc - fn * 0.693359375f;  // ln 2 split in two: the first product is exact
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t n1 = n >> 1, n2 = n - n1;  // 2^n = 2^n1 * 2^n2, each factor a normal float
  const float s1 = __builtin_bit_cast(float, uint32_t(n1 + 127) << 23);
  const float s2 = __builtin_bit_cast(float, uint32_t(n2 + 127) << 23);
  return p * s1 * s2;
}

inline double exp_f32(double x) = delete;  // f64 kernels use std::exp

// sum_j x[j] and sum_j a[j] * b[j].
float row_sum(const float* x, int64_t n);
float row_dot(const float* a, const float* b, int64_t n);
// max(x[0..n)), -inf for n == 0 (NaN when any element is NaN).
float row_max(const float* x, int64_t n);
// sum_j exp(x[j] - shift).
float row_sum_exp(const float* x, int64_t n, float shift);
// y[j] = exp(x[j] - shift) * scale; y may be x (in place).
void row_exp_scale(const float* x, int64_t n, float shift, float scale, float* y);
// y[j] = b[j] + exp(x[j] - shift) * scale; y may be x or b (in place).
void row_exp_axpy(const float* x, int64_t n, float shift, float scale, const float* b, float* y);

// bf16 (its bits) <-> f32, exactly as bfloat16's own conversions (to bf16: round to nearest even,
// NaN stays NaN); branch-free, for `#pragma omp simd` loops.
[[gnu::always_inline]] inline float bf16_bits_to_f32(uint16_t x) {
  return __builtin_bit_cast(float, uint32_t(x) << 16);
}
[[gnu::always_inline]] inline uint16_t f32_to_bf16_bits(float x) {
  const uint32_t u = __builtin_bit_cast(uint32_t, x);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return uint16_t(nan ? (u >> 16) | 0x40u : rounded);
}

// The same over n elements.
void row_bf16_to_f32(const uint16_t* x, int64_t n, float* y);
void row_f32_to_bf16(const float* x, int64_t n, uint16_t* y);

// SwiGLU over n elements: out[j] = silu(g[j]) * u[j], with silu(x) = x * sigmoid(x); and its
// backward, dg[j] and du[j] from dy[j] (either output may be null: not computed).
void row_swiglu(const float* g, const float* u, int64_t n, float* out);
void row_swiglu_backward(const float* dy, const float* g, const float* u, int64_t n, float* dg,
                         float* du);

// out[j] = a[j] op b[j] for op '+', '-', '*' or '/' (out may be a or b).
void row_arith(char op, const float* a, const float* b, int64_t n, float* out);

// RMSNorm of one row of d elements: y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps), which
// it returns. Its backward: dx = rstd * dy * w - x * rstd^3 / d * sum(dy * w * x) (when dx is not
// null) and dw_sum += dy * x * rstd (when dw_sum is not null).
float row_rms_norm(const float* x, const float* w, int64_t d, float eps, float* y);
void row_rms_norm_backward(const float* dy, const float* x, const float* w, float rstd, int64_t d,
                           float* dx, float* dw_sum);

// Rotary embedding of one head's `half` interleaved pairs (x[2i], x[2i+1]) by the angles whose
// cosines and sines are c[i] and sign * s[i] (sign -1: the inverse rotation).
void row_rope(const float* x, const float* c, const float* s, int64_t half, float sign, float* out);

// One AdamW step (optim_update.h's adamw_update) over n elements of a parameter, its gradient
// (multiplied by grad_scale first, as scaled_grad does) and its two f32 moments; the parameter and
// gradient are f32, or bf16 (their bits: the update runs in f32 and rounds p once).
void row_adamw(float* p, const float* g, float* m, float* v, int64_t n,
               const AdamWCoefficients<float>& c, float grad_scale);
void row_adamw(uint16_t* p, const uint16_t* g, float* m, float* v, int64_t n,
               const AdamWCoefficients<float>& c, float grad_scale);

}  // namespace mt::runtime::cpu
