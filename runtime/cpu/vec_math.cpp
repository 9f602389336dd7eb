// Built without trapping math (as if -fno-trapping-math) so that exp_f32's clamps and overflow
// paths can be if-converted and the loops vectorised; nothing here reads the FP exception flags.
#pragma GCC optimize("no-trapping-math")

#include "runtime/cpu/vec_math.h"

#include <limits>

namespace mt::runtime::cpu {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MT_VEC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
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
  bool nan = false;
#pragma omp simd reduction(max : m) reduction(|| : nan)
  for (int64_t j = 0; j < n; ++j) {
    m = x[j] > m ? x[j] : m;
    nan = nan || x[j] != x[j];
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
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

}  // namespace mt::runtime::cpu
