// CPU kernels of swiglu: one pass over contiguous elements, OpenMP over element ranges; f32
// through the vectorised rows of vec_math.h, bf16 through them too on f32 copies of chunks of
// kChunk elements (f32 math, one rounding per output, as elementwise), f64 elementwise with
// std::exp.
#include "runtime/kernels/swiglu.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "runtime/cpu/float8_amax.h"
#include "runtime/cpu/loops.h"
#include "runtime/cpu/vec_math.h"

namespace mt::runtime::cpu {
namespace {

constexpr int64_t kChunk = 512;

const uint16_t* bits(const bfloat16* p) { return &p->bits; }
uint16_t* bits(bfloat16* p) { return p ? &p->bits : nullptr; }

template <class C>
inline C sigmoid_of(C g) {
  return C(1) / (C(1) + std::exp(-g));
}

// out[i] = silu(g[i]) * u[i] for i in [0, n).
template <class T>
void forward_run(const T* g, const T* u, int64_t n, T* out) {
  if constexpr (std::is_same_v<T, float>) {
    row_swiglu(g, u, n, out);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    float g32[kChunk], u32[kChunk], o32[kChunk];
    for (int64_t c = 0; c < n; c += kChunk) {
      const int64_t m = std::min(kChunk, n - c);
      row_bf16_to_f32(bits(g + c), m, g32);
      row_bf16_to_f32(bits(u + c), m, u32);
      row_swiglu(g32, u32, m, o32);
      row_f32_to_bf16(o32, m, bits(out + c));
    }
  } else {
    using C = compute_t<T>;
    for (int64_t i = 0; i < n; ++i) {
      const C gi = C(g[i]);
      out[i] = T(gi * sigmoid_of(gi) * C(u[i]));
    }
  }
}

// dg[i] and du[i] (either may be null: not computed) from dy[i], for i in [0, n).
template <class T>
void backward_run(const T* dy, const T* g, const T* u, int64_t n, T* dg, T* du) {
  if constexpr (std::is_same_v<T, float>) {
    row_swiglu_backward(dy, g, u, n, dg, du);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    float dy32[kChunk], g32[kChunk], u32[kChunk], dg32[kChunk], du32[kChunk];
    for (int64_t c = 0; c < n; c += kChunk) {
      const int64_t m = std::min(kChunk, n - c);
      row_bf16_to_f32(bits(dy + c), m, dy32);
      row_bf16_to_f32(bits(g + c), m, g32);
      row_bf16_to_f32(bits(u + c), m, u32);
      row_swiglu_backward(dy32, g32, u32, m, dg ? dg32 : nullptr, du ? du32 : nullptr);
      if (dg) row_f32_to_bf16(dg32, m, bits(dg + c));
      if (du) row_f32_to_bf16(du32, m, bits(du + c));
    }
  } else {
    using C = compute_t<T>;
    for (int64_t i = 0; i < n; ++i) {
      const C gi = C(g[i]), d = C(dy[i]), s = sigmoid_of(gi);
      if (dg) dg[i] = T(d * C(u[i]) * s * (C(1) + gi * (C(1) - s)));
      if (du) du[i] = T(d * gi * s);
    }
  }
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out, Tensor& out_amax) {
  dispatch_floating(gate.dtype(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    const T* gp = gate.data<T>();
    const T* up_ = up.data<T>();
    T* op = out.data<T>();
    parallel_for(gate.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      forward_run(gp + begin, up_ + begin, end - begin, op + begin);
    });
  });
  // Float8 amaxes in a second pass here (the CPU gains nothing from fusing them).
  if (out_amax.defined()) float8_amax_into(out, out_amax);
}

void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup, Tensor& dgate_amax, Tensor& dup_amax) {
  dispatch_floating(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* dp = dy.data<T>();
    const T* gp = gate.data<T>();
    const T* up_ = up.data<T>();
    T* dgp = dgate.defined() ? dgate.data<T>() : nullptr;
    T* dup_ = dup.defined() ? dup.data<T>() : nullptr;
    parallel_for(gate.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      backward_run(dp + begin, gp + begin, up_ + begin, end - begin,
                   dgp ? dgp + begin : nullptr, dup_ ? dup_ + begin : nullptr);
    });
  });
  if (dgate_amax.defined()) float8_amax_into(dgate, dgate_amax);
  if (dup_amax.defined()) float8_amax_into(dup, dup_amax);
}

}  // namespace

MT_REGISTER_KERNEL(swiglu_forward_kernel, DeviceType::CPU, swiglu_forward);
MT_REGISTER_KERNEL(swiglu_backward_kernel, DeviceType::CPU, swiglu_backward);

}  // namespace mt::runtime::cpu
