// Built with -fno-trapping-math (runtime/CMakeLists.txt) so that exp_f32's clamps and overflow
// paths can be if-converted and the loops vectorised, and -fno-math-errno so that sqrt vectorises
// (AdamW); nothing here reads the FP exception flags or errno.

#include "runtime/cpu/vec_math.h"

#include <cmath>
#include <limits>

namespace mt::runtime::cpu {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MT_VEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MT_VEC_CLONES
#endif

MT_VEC_CLONES float row_sum(const float* x, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += x[j];
  return s;
}

MT_VEC_CLONES float row_dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

MT_VEC_CLONES float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int nans = 0;  // an int reduction: GCC does not vectorise a bool `||` one
#pragma omp simd reduction(max : m) reduction(| : nans)
  for (int64_t j = 0; j < n; ++j) {
    m = x[j] > m ? x[j] : m;
    nans |= int(x[j] != x[j]);
  }
  return nans ? std::numeric_limits<float>::quiet_NaN() : m;
}

MT_VEC_CLONES float row_sum_exp(const float* x, int64_t n, float shift) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += exp_f32(x[j] - shift);
  return s;
}

MT_VEC_CLONES void row_exp_scale(const float* x, int64_t n, float shift, float scale, float* y) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = exp_f32(x[j] - shift) * scale;
}

MT_VEC_CLONES void row_exp_axpy(const float* x, int64_t n, float shift, float scale, const float* b,
                                float* y) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = b[j] + exp_f32(x[j] - shift) * scale;
}

namespace {
[[gnu::always_inline]] inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

template <bool kGate, bool kUp>
[[gnu::always_inline]] inline void swiglu_backward_loop(const float* dy, const float* g,
                                                        const float* u, int64_t n, float* dg,
                                                        float* du) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float s = sigmoid_f32(g[j]);
    if constexpr (kGate) dg[j] = dy[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
    if constexpr (kUp) du[j] = dy[j] * g[j] * s;
  }
}
}  // namespace

MT_VEC_CLONES void row_bf16_to_f32(const uint16_t* x, int64_t n, float* y) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = bf16_bits_to_f32(x[j]);
}

MT_VEC_CLONES void row_f32_to_bf16(const float* x, int64_t n, uint16_t* y) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = f32_to_bf16_bits(x[j]);
}

MT_VEC_CLONES void row_swiglu(const float* g, const float* u, int64_t n, float* out) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = g[j] * sigmoid_f32(g[j]) * u[j];
}

MT_VEC_CLONES void row_swiglu_backward(const float* dy, const float* g, const float* u, int64_t n,
                                       float* dg, float* du) {
  if (dg && du) {
    swiglu_backward_loop<true, true>(dy, g, u, n, dg, du);
  } else if (dg) {
    swiglu_backward_loop<true, false>(dy, g, u, n, dg, du);
  } else if (du) {
    swiglu_backward_loop<false, true>(dy, g, u, n, dg, du);
  }
}

MT_VEC_CLONES void row_adamw(float* p, const float* g, float* m, float* v, int64_t n,
                             const AdamWCoefficients<float>& c, float grad_scale) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) adamw_update(g[j] * grad_scale, p[j], m[j], v[j], c);
}

MT_VEC_CLONES void row_adamw(uint16_t* p, const uint16_t* g, float* m, float* v, int64_t n,
                             const AdamWCoefficients<float>& c, float grad_scale) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    // scaled_grad: the product rounded to the gradient's dtype (exact when grad_scale is 1)
    const float gj = bf16_bits_to_f32(f32_to_bf16_bits(bf16_bits_to_f32(g[j]) * grad_scale));
    float pj = bf16_bits_to_f32(p[j]);
    adamw_update(gj, pj, m[j], v[j], c);
    p[j] = f32_to_bf16_bits(pj);
  }
}

MT_VEC_CLONES float row_rms_norm(const float* x, const float* w, int64_t d, float eps, float* y) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
  const float rstd = 1.0f / std::sqrt(ss / float(d) + eps);
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) y[i] = x[i] * rstd * w[i];
  return rstd;
}

MT_VEC_CLONES void row_rms_norm_backward(const float* dy, const float* x, const float* w,
                                         float rstd, int64_t d, float* dx, float* dw_sum) {
  if (dx) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < d; ++i) dot += dy[i] * w[i] * x[i];
    const float coef = rstd * rstd * rstd * dot / float(d);
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) dx[i] = rstd * dy[i] * w[i] - coef * x[i];
  }
  if (dw_sum) {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) dw_sum[i] += dy[i] * x[i] * rstd;
  }
}

MT_VEC_CLONES void row_rope(const float* x, const float* c, const float* s, int64_t half,
                            float sign, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float x0 = x[2 * i], x1 = x[2 * i + 1], si = sign * s[i];
    out[2 * i] = x0 * c[i] - x1 * si;
    out[2 * i + 1] = x0 * si + x1 * c[i];
  }
}

MT_VEC_CLONES void row_arith(char op, const float* a, const float* b, int64_t n, float* out) {
  switch (op) {
    case '+':
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[j] = a[j] + b[j];
      return;
    case '-':
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[j] = a[j] - b[j];
      return;
    case '*':
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[j] = a[j] * b[j];
      return;
    default:
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[j] = a[j] / b[j];
      return;
  }
}

}  // namespace mt::runtime::cpu
