// Float8 numerics (OCP FP8: e4m3fn and e5m2) and the kernel tables of float8 training (the op is
// runtime/ops/float8.h). The scalar conversions below are the CPU reference: the CUDA kernels use
// the hardware conversion (cvt.rn.satfinite) and are tested against these bit for bit.
//
// - Codes are one byte each. The runtime has no fp8 DType yet, so a tensor of codes has dtype
//   Bool (one byte per element) and is only ever read by the kernels below.
// - Conversion rounds to nearest even and saturates to the format's largest finite value
//   (torchao's to_fp8_saturated); NaN stays NaN.
// - Tensorwise scaling (torchao's recipe "tensorwise"): scale = max_finite / max(amax, 1e-12),
//   computed in double and rounded to f32; codes = fp8(f32(x) * scale); the GEMMs take
//   scale_inv = 1 / scale (f32) per operand.
// - Rowwise scaling (torchao's recipe "rowwise": axiswise, e4m3 everywhere, scales rounded down
//   to powers of two): the same per row, with that row's amax; scale_inv [rows].
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"
#include "runtime/kernels/optim_update.h"  // MT_HOST_DEVICE

namespace mt::runtime {

enum class Float8Format : uint8_t {
  E4M3,  // 4 exponent bits (bias 7), 3 mantissa bits, no infinities, max 448
  E5M2,  // 5 exponent bits (bias 15), 2 mantissa bits, max finite 57344
};

const char* float8_format_name(Float8Format f);  // "e4m3" / "e5m2"

MT_HOST_DEVICE inline float float8_max(Float8Format f) {
  return f == Float8Format::E4M3 ? 448.0f : 57344.0f;
}

// The f32 scale that maps amax onto the format's largest value.
MT_HOST_DEVICE inline float float8_scale(float amax, Float8Format f) {
  if (amax != amax) return amax;  // NaN
  const double clamped = amax > 1e-12f ? double(amax) : 1e-12;
  return float(double(float8_max(f)) / clamped);
}

// A scale rounded down to a power of two (torchao's round_scales_to_power_of_2): the exponent kept,
// the mantissa cleared, so x * scale stays within the format and the scaling itself is exact.
MT_HOST_DEVICE inline float float8_scale_pow2(float scale);

namespace float8_detail {
MT_HOST_DEVICE inline uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
MT_HOST_DEVICE inline float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
}  // namespace float8_detail

MT_HOST_DEVICE inline float float8_scale_pow2(float scale) {
  if (scale != scale) return scale;  // NaN
  return float8_detail::float_of(float8_detail::bits_of(scale) & 0xff800000u);
}

// f32 -> one fp8 code: round to nearest even, saturating to +-max, NaN -> the format's NaN.
MT_HOST_DEVICE inline uint8_t float_to_float8(float x, Float8Format f) {
  using namespace float8_detail;
  const bool e4m3 = f == Float8Format::E4M3;
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const uint32_t u = bits_of(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7f);  // NaN (e4m3's only NaN; e5m2's canonical one)
  float v = float_of(a);
  if (v >= float8_max(f)) v = float8_max(f);  // infinities too: satfinite
  // Below the smallest normal the codes are multiples of 2^(1 - bias - mbits): scale to an
  // integer count of those steps and round it to nearest even (adding and subtracting 2^23
  // rounds a float in [0, 2^23) to nearest even in the current, default rounding mode).
  const float min_normal = float_of(uint32_t(127 + 1 - bias) << 23);
  if (v < min_normal) {
    const float steps = v * float_of(uint32_t(127 - 1 + bias + mbits) << 23);
    const float rounded = (steps + 8388608.0f) - 8388608.0f;
    return uint8_t(sign | uint8_t(rounded));  // 2^mbits steps is the smallest normal's code
  }
  uint32_t r = bits_of(v);
  const int drop = 23 - mbits;
  r += (1u << (drop - 1)) - 1 + ((r >> drop) & 1u);  // round the dropped bits to nearest even
  const uint32_t exponent = (r >> 23) - 127 + uint32_t(bias);
  const uint32_t mantissa = (r >> drop) & ((1u << mbits) - 1);
  return uint8_t(sign | uint8_t((exponent << mbits) | mantissa));
}

// One fp8 code -> f32 (exact).
MT_HOST_DEVICE inline float float8_to_float(uint8_t code, Float8Format f) {
  using namespace float8_detail;
  const bool e4m3 = f == Float8Format::E4M3;
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t exponent = (code & 0x7fu) >> mbits;
  const uint32_t mantissa = code & ((1u << mbits) - 1);
  if (e4m3 && (code & 0x7fu) == 0x7fu) return float_of(sign | 0x7fc00000u);
  if (!e4m3 && exponent == 31) return float_of(sign | (mantissa ? 0x7fc00000u : 0x7f800000u));
  if (exponent == 0) {  // subnormal: mantissa * 2^(1 - bias - mbits)
    const float step = float_of(uint32_t(127 + 1 - bias - mbits) << 23);
    return float_of(sign | bits_of(float(mantissa) * step));
  }
  return float_of(sign | ((exponent - uint32_t(bias) + 127) << 23) | (mantissa << (23 - mbits)));
}

// Why this backend's current device cannot run FP8 GEMMs (e.g. a GPU before compute capability
// 8.9, named with its capability), or nullopt when it can (the CPU's reference always can).
inline constinit KernelTable<std::optional<std::string>()> float8_gemm_unsupported_kernel{
    "float8_gemm_unsupported"};

// amax [1] f32 = max |x| over every element of x (f32 or bf16, contiguous); NaN if any is NaN.
inline constinit KernelTable<void(const Tensor& x, Tensor& amax)> float8_amax_kernel{
    "float8_amax"};

// From x [rows, cols] (f32 or bf16, contiguous) and its amax [1]: scale_inv [1] = 1 / scale, and
// the codes of x * scale: `codes` [rows, cols] and/or `codes_t` [cols, rows] (x transposed); an
// undefined one is not written. Each is a contiguous Bool-dtype tensor of codes.
inline constinit KernelTable<void(const Tensor& x, const Tensor& amax, Float8Format format,
                                  Tensor& codes, Tensor& codes_t, Tensor& scale_inv)>
    float8_cast_kernel{"float8_cast"};

// Rowwise: from x [rows, cols] (f32 or bf16, contiguous), each row's amax (row_amax [rows] f32
// when given, else x's own) and scale (rounded down to a power of two when power_of_2), codes
// [rows, cols] of x * its row's scale and scale_inv [rows] (f32) = 1 / scale.
inline constinit KernelTable<void(const Tensor& x, const Tensor& row_amax, Float8Format format,
                                  bool power_of_2, Tensor& codes, Tensor& scale_inv)>
    float8_rowwise_cast_kernel{"float8_rowwise_cast"};
// Each row's amax of x [rows, cols] (f32 or bf16, contiguous) into row_amax [rows] (f32): what a
// rowwise cast reads, for a reduction across the ranks that hold other columns of the rows.
inline constinit KernelTable<void(const Tensor& x, Tensor& row_amax)> float8_rowwise_amax_kernel{
    "float8_rowwise_amax"};

// Columnwise, for backends that have it (the CUDA one): the rowwise cast of x's transpose
// without copying it. From x [rows, cols] (f32 or bf16, contiguous), each column's amax (col_amax
// [cols] f32 when given, else x's own), codes_t [cols, rows] and scale_inv [cols]: bit for bit
// float8_rowwise_cast of x.transpose(0, 1) made contiguous. to_float8_rowwise takes it for a
// transposed view where the device has it (weights by input feature, dy and x by feature).
inline constinit KernelTable<void(const Tensor& x, const Tensor& col_amax, Float8Format format,
                                  bool power_of_2, Tensor& codes_t, Tensor& scale_inv)>
    float8_colwise_cast_kernel{"float8_colwise_cast"};
// Each column's amax of x [rows, cols] (f32 or bf16, contiguous) into col_amax [cols] (f32).
inline constinit KernelTable<void(const Tensor& x, Tensor& col_amax)> float8_colwise_amax_kernel{
    "float8_colwise_amax"};

// Byte-for-byte moves of codes (contiguous Bool-dtype tensors). Codes never go through the
// runtime's Bool copies: a bool copy may keep only each byte's low bit.
// codes_t [cols, rows] = codes [rows, cols] transposed.
inline constinit KernelTable<void(const Tensor& codes, Tensor& codes_t)> float8_transpose_kernel{
    "float8_transpose"};
// dst = src (the same number of bytes).
inline constinit KernelTable<void(const Tensor& src, Tensor& dst)> float8_copy_kernel{
    "float8_copy"};

// out [M, N] (f32 or bf16) = (decode(a) * a_scale_inv) @ (decode(b) * b_scale_inv)^T, for codes
// a [M, K] and b [N, K] (both K-contiguous: the FP8 tensor cores' "TN" layout), f32 accumulation.
// A scale_inv is [1] (tensorwise) or one per row of its operand ([M], [N]: rowwise); either way
// out[i][j] = f32 sum * (a_scale_inv[i or 0] * b_scale_inv[j or 0]).
// fast_accum lets the GPU accumulate in its faster, less precise mode (forward GEMMs, as torchao).
inline constinit KernelTable<void(const Tensor& a, Float8Format a_format, const Tensor& a_scale_inv,
                                  const Tensor& b, Float8Format b_format, const Tensor& b_scale_inv,
                                  bool fast_accum, Tensor& out)>
    float8_matmul_kernel{"float8_matmul"};

}  // namespace mt::runtime
