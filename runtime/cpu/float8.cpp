// CPU kernels of float8 training: the exact reference the CUDA kernels are tested against. Codes
// come from the scalar conversions of runtime/kernels/float8.h; the GEMM decodes the codes to f32
// (exactly), multiplies with sgemm and applies the two inverse scales (per tensor or per row) to
// the f32 sums.
#include "runtime/kernels/float8.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/cpu/blas.h"
#include "runtime/cpu/float8_amax.h"
#include "runtime/cpu/loops.h"

namespace mt::runtime {

namespace cpu {
namespace {

const uint8_t* codes_of(const Tensor& t) { return static_cast<const uint8_t*>(t.data_ptr()); }
uint8_t* codes_of(Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }

std::optional<std::string> cpu_float8_gemm_unsupported() { return std::nullopt; }

// |x| as its f32 bits: unsigned order is float order for non-negative values, and NaN's bits
// exceed infinity's, so a NaN anywhere makes the maximum NaN.
template <class T>
uint32_t abs_bits(T v) {
  return float8_detail::bits_of(float(v)) & 0x7fffffffu;
}

void cpu_float8_amax(const Tensor& x, Tensor& amax) {
  uint32_t best = 0;
  dispatch_floating(x.dtype(), "float8_amax", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for reduction(max : best) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) best = std::max(best, abs_bits(p[i]));
  });
  amax.data<float>()[0] = float8_detail::float_of(best);
}

void cpu_float8_cast(const Tensor& x, const Tensor& amax, Float8Format format, Tensor& codes,
                     Tensor& codes_t, Tensor& scale_inv) {
  const float scale = float8_scale(amax.data<float>()[0], format);
  scale_inv.data<float>()[0] = 1.0f / scale;
  const int64_t rows = x.size(0), cols = x.size(1);
  uint8_t* out = codes.defined() ? codes_of(codes) : nullptr;
  uint8_t* out_t = codes_t.defined() ? codes_of(codes_t) : nullptr;
  dispatch_floating(x.dtype(), "float8_cast", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    parallel_for(rows, std::max<int64_t>(1, kParallelGrain / cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const uint8_t code = float_to_float8(float(p[r * cols + c]) * scale, format);
          if (out) out[r * cols + c] = code;
          if (out_t) out_t[c * rows + r] = code;
        }
      }
    });
  });
}

template <class T>
float row_amax_of(const T* row, int64_t cols) {
  uint32_t best = 0;
  for (int64_t c = 0; c < cols; ++c) best = std::max(best, abs_bits(row[c]));
  return float8_detail::float_of(best);
}

void cpu_float8_rowwise_amax(const Tensor& x, Tensor& row_amax) {
  const int64_t rows = x.size(0), cols = x.size(1);
  float* amax = row_amax.data<float>();
  dispatch_floating(x.dtype(), "float8_rowwise_amax", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(cols, 1)),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r) amax[r] = row_amax_of(p + r * cols, cols);
                 });
  });
}

void cpu_float8_rowwise_cast(const Tensor& x, const Tensor& row_amax, Float8Format format,
                             bool power_of_2, Tensor& codes, Tensor& scale_inv) {
  const int64_t rows = x.size(0), cols = x.size(1);
  uint8_t* out = codes_of(codes);
  float* inv = scale_inv.data<float>();
  const float* given = row_amax.defined() ? row_amax.data<float>() : nullptr;
  dispatch_floating(x.dtype(), "float8_rowwise_cast", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(cols, 1)),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r) {
                     const T* row = p + r * cols;
                     const float amax = given ? given[r] : row_amax_of(row, cols);
                     float scale = float8_scale(amax, format);
                     if (power_of_2) scale = float8_scale_pow2(scale);
                     inv[r] = 1.0f / scale;
                     for (int64_t c = 0; c < cols; ++c)
                       out[r * cols + c] = float_to_float8(float(row[c]) * scale, format);
                   }
                 });
  });
}

void cpu_float8_transpose(const Tensor& codes, Tensor& codes_t) {
  const int64_t rows = codes.size(0), cols = codes.size(1);
  const uint8_t* in = codes_of(codes);
  uint8_t* out = codes_of(codes_t);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
}

void cpu_float8_copy(const Tensor& src, Tensor& dst) {
  std::memcpy(codes_of(dst), codes_of(src), size_t(src.numel()));
}

std::vector<float> decoded(const Tensor& codes, Float8Format format) {
  std::vector<float> v(size_t(codes.numel()));
  const uint8_t* p = codes_of(codes);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float8_to_float(p[i], format);
  return v;
}

void cpu_float8_matmul(const Tensor& a, Float8Format a_format, const Tensor& a_scale_inv,
                       const Tensor& b, Float8Format b_format, const Tensor& b_scale_inv,
                       bool /*fast_accum: the CPU has one accumulation*/, Tensor& out) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const std::vector<float> av = decoded(a, a_format), bv = decoded(b, b_format);
  std::vector<float> c(size_t(m * n), 0.0f);
  if (k > 0) {
    gemm(CblasNoTrans, CblasTrans, blas_int(m, "float8_matmul"), blas_int(n, "float8_matmul"),
         blas_int(k, "float8_matmul"), av.data(), int(k), bv.data(), int(k), c.data(), int(n));
  }
  // One scale per operand (tensorwise) or per row of it (rowwise).
  const float* sa = a_scale_inv.data<float>();
  const float* sb = b_scale_inv.data<float>();
  const bool a_rows = a_scale_inv.numel() > 1, b_rows = b_scale_inv.numel() > 1;
  dispatch_floating(out.dtype(), "float8_matmul", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const float scale = sa[a_rows ? i : 0] * sb[b_rows ? j : 0];
        o[i * n + j] = T(c[size_t(i * n + j)] * scale);
      }
  });
}

MT_REGISTER_KERNEL(float8_gemm_unsupported_kernel, DeviceType::CPU, cpu_float8_gemm_unsupported);
MT_REGISTER_KERNEL(float8_amax_kernel, DeviceType::CPU, cpu_float8_amax);
MT_REGISTER_KERNEL(float8_cast_kernel, DeviceType::CPU, cpu_float8_cast);
MT_REGISTER_KERNEL(float8_matmul_kernel, DeviceType::CPU, cpu_float8_matmul);
MT_REGISTER_KERNEL(float8_rowwise_cast_kernel, DeviceType::CPU, cpu_float8_rowwise_cast);
MT_REGISTER_KERNEL(float8_rowwise_amax_kernel, DeviceType::CPU, cpu_float8_rowwise_amax);
MT_REGISTER_KERNEL(float8_transpose_kernel, DeviceType::CPU, cpu_float8_transpose);
MT_REGISTER_KERNEL(float8_copy_kernel, DeviceType::CPU, cpu_float8_copy);

}  // namespace

void float8_amax_into(const Tensor& x, Tensor& amax) { cpu_float8_amax(x, amax); }

}  // namespace cpu
}  // namespace mt::runtime
