// CUDA kernels of rope and swiglu, memory-bound single passes computing in f32 (f64 for f64) that
// move 16-byte packs (packed.cuh), several per thread in flight. swiglu's f32 sigmoid uses the
// fast exp and division intrinsics (see sigmoid_of).
// - swiglu forward and backward: packs of every operand at the same index (launch_packed_op; one
//   element at a time for misaligned pointers and the last n % V elements); each may also
//   measure max |output| for a float8 cast (amax.cuh), one atomic per block and output.
// - rope: one block per token (b, t), whose H * D elements (contiguous, tokens evenly spaced in
//   x) are packs of P pairs read with the P matching entries of the cos/sin rows of the token's
//   position. When D / 2 is not a multiple of
//   P or a pointer is misaligned, one pair at a time, its elements read one by one.
#include <algorithm>
#include <limits>
#include <type_traits>

#include "runtime/cuda/amax.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/packed.cuh"
#include "runtime/kernels/rope.h"
#include "runtime/kernels/swiglu.h"

namespace mt::runtime::cuda {
namespace {

constexpr int kRopePacksPerThread = 4;

// One token's rotation, by packs of P pairs: pair i of x (elements 2i, 2i + 1 of the token's
// H * D) rotated by (cos, sign * sin)[i % (D / 2)] of the position's table rows. kVector: x and
// out accessed as packs, else element by element.
template <class T, class A, int P, bool kVector>
struct RopeToken {
  const T* x;
  T* out;
  const A* cos;
  const A* sin;
  int head_packs;  // D / 2 / P
  A sign;

  struct Loaded {
    Pack<T, 2 * P> x;
    Pack<A, P> cos, sin;
  };

  __device__ Loaded load(int64_t k) const {
    const int i = int(k) % head_packs;
    Loaded in{{}, load_pack<P>(cos, i), load_pack<P>(sin, i)};
    if constexpr (kVector) {
      in.x = load_pack<2 * P>(x, k);
    } else {
#pragma unroll
      for (int e = 0; e < 2 * P; ++e) in.x.v[e] = x[k * 2 * P + e];
    }
    return in;
  }

  __device__ void store(int64_t k, const Loaded& in) const {
    Pack<T, 2 * P> o;
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const A c = in.cos.v[q], s = sign * in.sin.v[q];
      const A x0 = A(in.x.v[2 * q]), x1 = A(in.x.v[2 * q + 1]);
      o.v[2 * q] = T(x0 * c - x1 * s);
      o.v[2 * q + 1] = T(x0 * s + x1 * c);
    }
    if constexpr (kVector) {
      store_pack<2 * P>(out, k, o);
    } else {
#pragma unroll
      for (int e = 0; e < 2 * P; ++e) out[k * 2 * P + e] = o.v[e];
    }
  }
};

// Block b: token b (position position_offset + b % seq), its token_packs packs over the threads.
template <class T, class A, int P, bool kVector>
__global__ void rope_tokens(const T* x, int64_t x_token_stride, const A* cos, const A* sin,
                            int64_t seq, int64_t position_offset, int token_packs, int head_packs,
                            A sign, T* out) {
  const int64_t token = blockIdx.x;
  const int64_t first = token * token_packs * 2 * P;  // the token's first element in out
  const int64_t table_row = (position_offset + token % seq) * head_packs * P;
  const RopeToken<T, A, P, kVector> op{.x = x + token * x_token_stride,
                                       .out = out + first,
                                       .cos = cos + table_row,
                                       .sin = sin + table_row,
                                       .head_packs = head_packs,
                                       .sign = sign};
  load_then_store<kRopePacksPerThread>(threadIdx.x, token_packs, blockDim.x, op);
}

template <int P, bool kVector, class T, class A>
void launch_rope(const T* x, int64_t x_token_stride, const A* cos, const A* sin, int64_t tokens,
                 int64_t seq, int64_t position_offset, int64_t token_pairs, int64_t half, A sign,
                 T* out) {
  const int64_t token_packs = token_pairs / P;
  MT_CHECK(tokens <= std::numeric_limits<int32_t>::max() &&
               token_packs <= std::numeric_limits<int32_t>::max(),
           "apply_rope: ", tokens, " tokens of ", token_pairs, " pairs exceed the kernel's limit");
  const int64_t warps = (token_packs + 32 * kRopePacksPerThread - 1) / (32 * kRopePacksPerThread);
  const int threads = int(std::min<int64_t>(warps * 32, kThreads));
  rope_tokens<T, A, P, kVector><<<unsigned(tokens), threads, 0, current_stream()>>>(
      x, x_token_stride, cos, sin, seq, position_offset, int(token_packs), int(half / P), sign,
      out);
  MT_CUDA_CHECK_LAUNCH();
}

void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset,
          bool inverse, Tensor& out) {
  check_on_current_device(x, "apply_rope");
  if (x.numel() == 0) return;
  const int64_t seq = x.shape()[1], heads = x.shape()[2], half = x.shape()[3] / 2;
  const int64_t token_pairs = heads * half, tokens = x.numel() / (2 * token_pairs);
  MT_CUDA_DISPATCH_FLOATING(x.dtype(), "apply_rope", T, [&] {
    using A = acc_t<T>;
    constexpr int P = pack_width<T>() / 2;  // pairs in a 16-byte pack of x
    const T* xp = ptr<T>(x);
    T* op = ptr<T>(out);
    const A* cp = ptr<A>(cos);
    const A* sp = ptr<A>(sin);
    const A sign = inverse ? A(-1) : A(1);
    const int64_t stride = x.stride(1);  // between tokens (rope_reads_in_place)
    // Packs need every token's first element aligned too.
    if (half % P == 0 && (stride * int64_t(sizeof(T))) % 16 == 0 && packable<2 * P>(xp, op) &&
        packable<P>(cp, sp))
      launch_rope<P, true>(xp, stride, cp, sp, tokens, seq, position_offset, token_pairs, half,
                           sign, op);
    else
      launch_rope<1, false>(xp, stride, cp, sp, tokens, seq, position_offset, token_pairs, half,
                            sign, op);
  });
}

// In f32 (the compute type of f32, bf16 and f16) through the hardware's approximations: __expf
// (2 + 1.2|g| ulp) and __fdividef (2 ulp; 0 once 1 + e^-g passes 2^126, where the sigmoid is
// under 2^-126 anyway), a few instructions where expf and an IEEE division take several times
// more in a kernel meant to be bound by memory. f64 stays exact.
template <class A>
__device__ inline A sigmoid_of(A g) {
  if constexpr (std::is_same_v<A, float>) {
    return __fdividef(1.0f, 1.0f + __expf(-g));
  } else {
    return A(1) / (A(1) + exp(-g));
  }
}

// out = silu(gate) * up, on packs of V elements; amax (nullable): raised to max |out| as stored
// (amax.cuh).
template <class T, int V>
struct SwigluForward {
  const T* gate;
  const T* up;
  T* out;
  unsigned* amax;
  mutable unsigned out_max = 0;  // this thread's share

  struct Loaded {
    Pack<T, V> gate, up;
  };

  __device__ Loaded load(int64_t j) const { return {load_pack<V>(gate, j), load_pack<V>(up, j)}; }

  __device__ void store(int64_t j, const Loaded& in) const {
    using A = acc_t<T>;
    Pack<T, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A g = A(in.gate.v[e]);
      o.v[e] = T(g * sigmoid_of(g) * A(in.up.v[e]));
    }
    store_pack<V>(out, j, o);
    if (amax) {
#pragma unroll
      for (int e = 0; e < V; ++e) out_max = max(out_max, abs_bits(float(o.v[e])));
    }
  }

  __device__ void finish(const SwigluForward<T, 1>& tail) const {
    if (amax) raise_amax_over_block(max(out_max, tail.out_max), amax);
  }
};

// Where swiglu's backward raises its outputs' amaxes (either may be null).
struct SwigluBackwardAmaxes {
  unsigned* dgate;
  unsigned* dup;
};

// dgate = dy * up * s * (1 + gate * (1 - s)), dup = dy * gate * s with s = sigmoid(gate), on
// packs of V elements; a null dgate or dup is not written (up is not read without dgate).
// kMeasures: raises the amaxes (a float8 step); without it the kernel keeps its registers for
// the loads in flight (bf16: 128 registers against 143, two blocks of 256 threads an SM, not one).
template <class T, int V, bool kMeasures>
struct SwigluBackward {
  const T* dy;
  const T* gate;
  const T* up;
  T* dgate;
  T* dup;
  SwigluBackwardAmaxes amax;
  mutable unsigned dgate_max = 0, dup_max = 0;  // this thread's shares

  struct Loaded {
    Pack<T, V> dy, gate, up;
  };

  __device__ Loaded load(int64_t j) const {
    return {load_pack<V>(dy, j), load_pack<V>(gate, j), dgate ? load_pack<V>(up, j) : Pack<T, V>{}};
  }

  __device__ void store(int64_t j, const Loaded& in) const {
    using A = acc_t<T>;
    Pack<T, V> dg, du;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A g = A(in.gate.v[e]), d = A(in.dy.v[e]), s = sigmoid_of(g);
      dg.v[e] = T(d * A(in.up.v[e]) * s * (A(1) + g * (A(1) - s)));
      du.v[e] = T(d * g * s);
    }
    if (dgate) store_pack<V>(dgate, j, dg);
    if (dup) store_pack<V>(dup, j, du);
    if constexpr (kMeasures) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if (amax.dgate) dgate_max = max(dgate_max, abs_bits(float(dg.v[e])));
        if (amax.dup) dup_max = max(dup_max, abs_bits(float(du.v[e])));
      }
    }
  }

  __device__ void finish(const SwigluBackward<T, 1, kMeasures>& tail) const
    requires kMeasures
  {
    if (amax.dgate) raise_amax_over_block(max(dgate_max, tail.dgate_max), amax.dgate);
    if (amax.dup) raise_amax_over_block(max(dup_max, tail.dup_max), amax.dup);
  }
};

template <class T, int V>
using SwigluBackwardMeasuring = SwigluBackward<T, V, true>;
template <class T, int V>
using SwigluBackwardPlain = SwigluBackward<T, V, false>;

unsigned* amax_slot(Tensor& amax) { return amax.defined() ? ptr<unsigned>(amax) : nullptr; }

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out, Tensor& out_amax) {
  check_on_current_device(gate, "swiglu");
  MT_CUDA_DISPATCH_FLOATING(gate.dtype(), "swiglu", T, [&] {
    launch_packed_op<SwigluForward, T>(gate.numel(), amax_slot(out_amax), ptr<T>(gate),
                                       ptr<T>(up), ptr<T>(out));
  });
}

void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup, Tensor& dgate_amax, Tensor& dup_amax) {
  check_on_current_device(gate, "swiglu_backward");
  MT_CUDA_DISPATCH_FLOATING(gate.dtype(), "swiglu_backward", T, [&] {
    T* dgp = dgate.defined() ? ptr<T>(dgate) : nullptr;
    T* dupp = dup.defined() ? ptr<T>(dup) : nullptr;
    const SwigluBackwardAmaxes amaxes{dgp ? amax_slot(dgate_amax) : nullptr,
                                      dupp ? amax_slot(dup_amax) : nullptr};
    if (amaxes.dgate || amaxes.dup) {
      launch_packed_op<SwigluBackwardMeasuring, T>(gate.numel(), amaxes, ptr<T>(dy),
                                                   ptr<T>(gate), ptr<T>(up), dgp, dupp);
    } else {
      launch_packed_op<SwigluBackwardPlain, T>(gate.numel(), amaxes, ptr<T>(dy), ptr<T>(gate),
                                               ptr<T>(up), dgp, dupp);
    }
  });
}

MT_REGISTER_KERNEL(rope_kernel, DeviceType::CUDA, rope);
MT_REGISTER_KERNEL(swiglu_forward_kernel, DeviceType::CUDA, swiglu_forward);
MT_REGISTER_KERNEL(swiglu_backward_kernel, DeviceType::CUDA, swiglu_backward);

}  // namespace
}  // namespace mt::runtime::cuda
