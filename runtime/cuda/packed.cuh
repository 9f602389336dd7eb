// Vector loads and stores for memory-bound kernels: a Pack<T, V> is V elements moved as one
// aligned access (16 bytes for 8 bf16, 4 f32 or 2 f64), so every thread keeps several bytes in
// flight. One 2-byte load per thread in flight reaches only ~30% of an H100/H200's bandwidth.
//
//   if (packable<8>(x, y)) { Pack<T, 8> p = load_pack<8>(x, i); ...; store_pack<8>(y, i, p); }
//
// i counts packs (element offset i * V). The caller checks alignment with packable() first and
// handles the n % V tail elements one by one.
//
// For ops with several outputs, or inputs read at other indices, an op object splits the work of
// index j into load(j) (returns what it read) and store(j, loaded): load_then_store runs kUnroll
// loads per thread before their stores, so several packs per thread are in flight (the compiler
// cannot move a load above a store that may alias it). launch_packed_op runs such an op over
// contiguous operands, on packs where the pointers allow it. (For out = f(inputs) ops, loops.cuh's
// launch_packed / launch_map are simpler: one output, f on values.)
#pragma once

#include <cstdint>

#include "runtime/cuda/context.h"

namespace mt::runtime::cuda {

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// The elements per pack for a 16-byte access of the widest of the types (at least 1).
template <class... T>
constexpr int pack_width() {
  size_t widest = 1;
  ((widest = sizeof(T) > widest ? sizeof(T) : widest), ...);
  return widest >= 16 ? 1 : int(16 / widest);
}

template <int V, class T>
__device__ inline Pack<T, V> load_pack(const T* p, int64_t i) {
  return reinterpret_cast<const Pack<T, V>*>(p)[i];
}

template <int V, class T>
__device__ inline void store_pack(T* p, int64_t i, const Pack<T, V>& v) {
  reinterpret_cast<Pack<T, V>*>(p)[i] = v;
}

// Whether every pointer is aligned for packs of V of its element type.
template <int V, class... T>
inline bool packable(const T*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % (sizeof(T) * V) == 0) && ...);
}

// op.store(j, op.load(j)) for j = first, first + stride, ... < end: kUnroll loads, then their
// stores.
template <int kUnroll, class Op>
__device__ inline void load_then_store(int64_t first, int64_t end, int64_t stride, const Op& op) {
  for (int64_t base = first; base < end; base += kUnroll * stride) {
    decltype(op.load(base)) loaded[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * stride < end) loaded[u] = op.load(base + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * stride < end) op.store(base + u * stride, loaded[u]);
  }
}

// Packs [0, n_packs) with `packs`, then elements [tail_begin, n) with `elements`; grid-stride.
// An op that also reduces what it writes (swiglu's float8 amaxes) keeps its thread's share in
// mutable members and has finish(elements): called after the loops, by every thread of the
// block, for block-wide reductions.
template <int kUnroll, class Packs, class Elements>
__global__ void packed_op_kernel(int64_t n_packs, int64_t tail_begin, int64_t n, Packs packs,
                                 Elements elements) {
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  load_then_store<kUnroll>(first, n_packs, stride, packs);
  load_then_store<1>(tail_begin + first, n, stride, elements);
  if constexpr (requires { packs.finish(elements); }) packs.finish(elements);
}

// Op<T, V> over the packs of n contiguous elements when every pointer is aligned for them, with
// kUnroll packs per thread in flight, and Op<T, 1> over the n % V last elements; Op<T, 1> over
// all n when a pointer is misaligned. Op<T, W> is an aggregate of `ptrs` (null ones included),
// then `extra` (what is not an operand read or written in packs: where it reduces into), whose
// load and store take the index of a pack of W elements. On the current stream.
template <template <class, int> class Op, class T, int kUnroll = 4, class Extra, class... P>
void launch_packed_op(int64_t n, const Extra& extra, P*... ptrs) {
  if (n <= 0) return;
  constexpr int V = pack_width<T>();
  const int64_t n_packs = packable<V>(ptrs...) ? n / V : 0;
  const int64_t tail_begin = n_packs * V;
  const int64_t threads = (n_packs + kUnroll - 1) / kUnroll;
  packed_op_kernel<kUnroll>
      <<<blocks_for(threads > n - tail_begin ? threads : n - tail_begin), kThreads, 0,
         current_stream()>>>(n_packs, tail_begin, n, Op<T, V>{ptrs..., extra},
                             Op<T, 1>{ptrs..., extra});
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::runtime::cuda
