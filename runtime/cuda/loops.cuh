// Building blocks of the CUDA kernels: device element types, value conversion, dtype dispatch,
// and launchers for elementwise loops: over strided tensors (launch_elementwise), over contiguous
// ones with 16-byte accesses (launch_packed), and launch_map, which picks one of the two for an
// out = f(inputs) op on tensors.
//
// Element types on the device: float, double, __nv_bfloat16, __half, int32_t, int64_t, bool.
// 16-bit floats compute in f32 (acc_t<T>) and round to nearest even on store, as on the CPU.
//
//   MT_CUDA_DISPATCH_FLOATING(x.dtype(), "op", T, [&] { ... T is the element type ... });
//   launch_elementwise<2>(out.shape(), {out.strides(), x.strides()},
//       [=] __device__(const int64_t* off) { o[off[0]] = f(x[off[1]]); });
//   launch_map<T, T>(out, [=] __device__(T v) { return f(v); }, x);  // packed when contiguous
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <vector>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>

#include "runtime/core/tensor.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/packed.cuh"

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

// Value conversion with the CPU backend's rules: float -> int saturates (NaN -> 0), -> bool is
// != 0.
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

// An input of launch_packed: n contiguous elements read at the output's index, or (broadcast)
// one element that every output element reads.
template <class T>
struct PackedInput {
  const T* p;
  bool broadcast = false;
};

template <class T>
PackedInput<T> packed_input(const T* p) {
  return {p};
}
template <class T>
PackedInput<T> packed_input(PackedInput<T> x) {
  return x;
}

// An input as one thread reads it: a broadcast element is loaded once, before the loop.
template <class T>
struct PackedReader {
  const T* p;
  bool broadcast;
  T value;

  __device__ explicit PackedReader(PackedInput<T> x)
      : p(x.p), broadcast(x.broadcast), value(x.broadcast ? *x.p : T()) {}
  template <int V>
  __device__ Pack<T, V> pack(int64_t i) const {
    if (!broadcast) return load_pack<V>(p, i);
    Pack<T, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = value;
    return r;
  }
  __device__ T element(int64_t i) const { return broadcast ? value : p[i]; }
};

template <int V, class O, class F, class... T>
__device__ inline Pack<O, V> apply_to_packs(const F& f, const Pack<T, V>&... x) {
  Pack<O, V> r;
#pragma unroll
  for (int j = 0; j < V; ++j) r.v[j] = f(x.v[j]...);
  return r;
}

// Packs [0, n_packs) (elements [0, n_packs * V)), then the elements [n_packs * V, n) one per
// thread; both loops grid-stride.
template <int V, class F, class O, class... T>
__device__ inline void packed_loop(int64_t n_packs, int64_t n, const F& f, O* out,
                                   const PackedReader<T>&... in) {
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < n_packs; i += stride)
    store_pack<V>(out, i, apply_to_packs<V, O>(f, in.template pack<V>(i)...));
  for (int64_t i = n_packs * V + first; i < n; i += stride) out[i] = f(in.element(i)...);
}

template <int V, class F, class O, class... T>
__global__ void packed_kernel(int64_t n_packs, int64_t n, F f, O* out, PackedInput<T>... in) {
  packed_loop<V>(n_packs, n, f, out, PackedReader<T>(in)...);
}

template <class F, class O, class... T>
void launch_packed_inputs(int64_t n, F f, O* out, PackedInput<T>... in) {
  if (n <= 0) return;
  constexpr int V = pack_width<O, T...>();
  const bool aligned = packable<V>(out, (in.broadcast ? nullptr : in.p)...);
  const int64_t n_packs = aligned ? n / V : 0;
  const int64_t tail = n - n_packs * V;
  packed_kernel<V><<<blocks_for(n_packs > tail ? n_packs : tail), kThreads, 0,
                     current_stream()>>>(n_packs, n, f, out, in...);
  MT_CUDA_CHECK_LAUNCH();
}

// out[i] = f(in[i]...) for i in [0, n) on the current stream, for contiguous operands: each
// thread loads one 16-byte pack per input (V elements, V set by the widest element type), applies
// f to each element and stores one pack of out, so enough bytes are in flight to approach the
// memory bandwidth (one element per thread reaches less than half of it on an H200; more packs
// per thread did not help there). An input is a `const T*` (n elements) or a PackedInput
// (possibly broadcast); f takes the inputs' values and returns out's (with no input it is a
// generator, as for fill). The n % V tail, and every element when a pointer is not aligned for
// packs, run one element per thread.
template <class F, class O, class... In>
void launch_packed(int64_t n, F f, O* out, In... in) {
  launch_packed_inputs(n, f, out, packed_input(in)...);
}

// Whether every element of `t` is the same one (each dimension has size 1 or stride 0: a 0-D
// tensor, or one expanded from a single element).
inline bool single_element(const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.shape()[d] != 1 && t.strides()[d] != 0) return false;
  return true;
}

// The inputs of a strided map as untyped pointers that keep their types T (an extended lambda
// cannot capture a parameter pack): f(in[off[1]]...) for the offsets off of out and the inputs.
template <class... T>
struct StridedInputs {
  static constexpr int kCount = int(sizeof...(T));
  std::array<const void*, sizeof...(T)> p;

  template <class F>
  __device__ auto apply(const F& f, const int64_t* off) const {
    return apply(f, off, std::index_sequence_for<T...>{});
  }
  template <class F, size_t... K>
  __device__ auto apply(const F& f, const int64_t* off, std::index_sequence<K...>) const {
    return f(static_cast<const T*>(p[K])[off[K + 1]]...);
  }
};

template <class F, class O, class In>
void launch_strided_map(const Shape& shape, const std::array<Shape, In::kCount + 1>& strides,
                        F f, O* out, In in) {
  launch_elementwise<In::kCount + 1>(shape, strides, [=] __device__(const int64_t* off) {
    out[off[0]] = in.apply(f, off);
  });
}

// Whether launch_map can run launch_packed: out is contiguous and every input is contiguous with
// out's shape or a single element.
inline bool packed_map_applies(const Tensor& out, std::initializer_list<const Tensor*> in) {
  if (!out.is_contiguous()) return false;
  for (const Tensor* t : in)
    if (!(t->shape() == out.shape() && t->is_contiguous()) && !single_element(*t)) return false;
  return true;
}

// The strides of out and of the inputs broadcast to out's shape.
template <size_t N>
std::array<Shape, N + 1> map_strides(const Tensor& out, const std::array<const Tensor*, N>& in) {
  std::array<Shape, N + 1> strides;
  strides[0] = out.strides();
  size_t k = 1;
  for (const Tensor* t : in)
    strides[k++] = broadcast_strides(t->shape(), t->strides(), out.shape());
  return strides;
}

// A `const Tensor&` per element type of launch_map's inputs.
template <class T>
using TensorOf = const Tensor&;

// out = f(in...) elementwise, inputs broadcast to out's shape, on the current stream; O and T...
// are the device element types of out and of the inputs. Runs launch_packed when out is
// contiguous and every input is either contiguous with out's shape or a single element (read
// once per thread), else the strided loop (launch_elementwise).
template <class O, class... T, class F>
void launch_map(const Tensor& out, F f, TensorOf<T>... in) {
  if (packed_map_applies(out, {&in...})) {
    launch_packed(out.numel(), f, ptr<O>(out), PackedInput<T>{ptr<T>(in), single_element(in)}...);
    return;
  }
  launch_strided_map(out.shape(), map_strides<sizeof...(T)>(out, {&in...}), f, ptr<O>(out),
                     StridedInputs<T...>{{ptr<T>(in)...}});
}

}  // namespace mt::runtime::cuda
