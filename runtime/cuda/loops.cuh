// Building blocks of the CUDA kernels: device element types, value conversion, dtype dispatch,
// and launchers for elementwise loops over strided tensors.
//
// Element types on the device: float, double, __nv_bfloat16, __half, int32_t, int64_t, bool.
// 16-bit floats compute in f32 (acc_t<T>) and round to nearest even on store, as on the CPU.
//
//   MT_CUDA_DISPATCH_FLOATING(x.dtype(), "op", T, [&] { ... T is the element type ... });
//   launch_elementwise<2>(out.shape(), {out.strides(), x.strides()},
//       [=] __device__(const int64_t* off) { o[off[0]] = f(x[off[1]]); });
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <vector>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "runtime/core/tensor.h"
#include "runtime/cuda/context.h"

namespace mt::runtime::cuda {

template <class T>
struct acc_type {
  using type = T;
};
template <>
struct acc_type<__nv_bfloat16> {
  using type = float;
};
template <>
struct acc_type<__half> {
  using type = float;
};
template <class T>
using acc_t = typename acc_type<T>::type;

// Value conversion with the CPU backend's rules: float -> int saturates (NaN -> 0), -> bool is != 0.
template <class To, class From>
__host__ __device__ inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __nv_bfloat16> || std::is_same_v<From, __half>) {
    return convert<To>(float(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(float(v));
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(float(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_integral_v<To> && !std::is_integral_v<From>) {
    if (!(v == v)) return To(0);
    const double d = double(v);
    constexpr double lo = double(std::numeric_limits<To>::min());
    constexpr double hi = double(std::numeric_limits<To>::max());
    if (d <= lo) return std::numeric_limits<To>::min();
    if (d >= hi) return std::numeric_limits<To>::max();
    return To(d);
  } else {
    return To(v);
  }
}

// Dtype dispatch. nvcc does not allow __device__ lambdas inside generic (auto) lambdas, so the
// dispatch is a macro that names the element type: the body (a lambda without parameters) is
// expanded once per dtype with `T` an alias of the device type:
//   MT_CUDA_DISPATCH_ALL(t.dtype(), "op", T, [&] { launch_linear(n, [=] __device__(int64_t i) {
//     ptr<T>(t)[i] = ...; }); });
#define MT_CUDA_CASE(enum_value, cpp_type, T, ...) \
  case ::mt::runtime::DType::enum_value: {         \
    using T = cpp_type;                            \
    return __VA_ARGS__();                          \
  }
#define MT_CUDA_FLOATING_CASES(T, ...)               \
  MT_CUDA_CASE(F32, float, T, __VA_ARGS__)           \
  MT_CUDA_CASE(F64, double, T, __VA_ARGS__)          \
  MT_CUDA_CASE(BF16, __nv_bfloat16, T, __VA_ARGS__)  \
  MT_CUDA_CASE(F16, __half, T, __VA_ARGS__)
// Every dtype.
#define MT_CUDA_DISPATCH_ALL(dtype, op, T, ...)                 \
  [&] {                                                         \
    switch (dtype) {                                            \
      MT_CUDA_FLOATING_CASES(T, __VA_ARGS__)                    \
      MT_CUDA_CASE(I32, int32_t, T, __VA_ARGS__)                \
      MT_CUDA_CASE(I64, int64_t, T, __VA_ARGS__)                \
      MT_CUDA_CASE(Bool, bool, T, __VA_ARGS__)                  \
    }                                                           \
    MT_FAIL(op, ": unknown dtype");                             \
  }()
// The floating dtypes (f32, f64, bf16, f16).
#define MT_CUDA_DISPATCH_FLOATING(dtype, op, T, ...)                                        \
  [&] {                                                                                     \
    switch (dtype) {                                                                        \
      MT_CUDA_FLOATING_CASES(T, __VA_ARGS__)                                                \
      default:                                                                              \
        break;                                                                              \
    }                                                                                       \
    MT_FAIL(op, ": expected a floating dtype (f32, f64, bf16, f16), got ", dtype_name(dtype)); \
  }()

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// Element offsets of N operands for a linear index over `shape` (row-major), by value so it can
// be passed to kernels. Up to kMaxDims dimensions.
inline constexpr int kMaxDims = 10;
template <int N>
struct OffsetCalculator {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  __device__ inline void offsets(int64_t linear, int64_t* out) const {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] += i * strides[k][d];
    }
  }
};

template <int N>
OffsetCalculator<N> make_offset_calculator(const Shape& shape,
                                           const std::array<Shape, N>& strides) {
  OffsetCalculator<N> c;
  // Merge dimensions that are contiguous in every operand (fewer divisions per element).
  std::vector<int64_t> sizes;
  std::array<std::vector<int64_t>, N> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (int k = 0; k < N && merge; ++k)
      merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      sizes.back() *= shape[d];
      for (int k = 0; k < N; ++k) st[k].back() = strides[k][d];
    } else {
      sizes.push_back(shape[d]);
      for (int k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
    }
  }
  MT_CHECK(int(sizes.size()) <= kMaxDims, "CUDA kernels take at most ", kMaxDims,
           " non-mergeable dimensions, got shape ", shape);
  c.ndim = int(sizes.size());
  for (int d = 0; d < c.ndim; ++d) {
    c.sizes[d] = sizes[size_t(d)];
    for (int k = 0; k < N; ++k) c.strides[k][d] = st[k][size_t(d)];
  }
  return c;
}

template <int N, class F>
__global__ void elementwise_kernel(int64_t n, OffsetCalculator<N> calc, F f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[N];
    calc.offsets(i, off);
    f(off);
  }
}

template <class F>
__global__ void linear_kernel(int64_t n, F f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    f(i);
}

// f(int64_t i) for i in [0, n) on the current stream.
template <class F>
void launch_linear(int64_t n, F f) {
  if (n <= 0) return;
  linear_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(n, f);
  MT_CUDA_CHECK_LAUNCH();
}

// f(const int64_t* offsets) for every element of `shape`; offsets[k] is the element offset of
// operand k (strides[k]; broadcast dims have stride 0). When every operand is contiguous the
// offsets are all the linear index.
template <int N, class F>
void launch_elementwise(const Shape& shape, const std::array<Shape, N>& strides, F f) {
  const int64_t n = numel_of(shape);
  if (n <= 0) return;
  const OffsetCalculator<N> calc = make_offset_calculator<N>(shape, strides);
  if (calc.ndim <= 1) {
    int64_t st[N];
    for (int k = 0; k < N; ++k) st[k] = calc.ndim == 0 ? 0 : calc.strides[k][0];
    bool unit = true;
    for (int k = 0; k < N; ++k) unit = unit && st[k] == 1;
    if (unit) {
      launch_linear(n, [=] __device__(int64_t i) {
        int64_t off[N];
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] = i;
        f(off);
      });
      return;
    }
  }
  elementwise_kernel<N><<<blocks_for(n), kThreads, 0, current_stream()>>>(n, calc, f);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::runtime::cuda
