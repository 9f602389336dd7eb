// CUDA kernels of rms_norm, moving 16-byte packs (packed.cuh) when D is a multiple of the pack
// width and every pointer is aligned for packs (else packs of one element, same kernels).
// - Forward and dx: a row's threads are a warp (several rows per block) or, for rows too long for
//   a warp, the whole block (up to kMaxRowThreads). Each thread keeps its first packs of the row
//   in registers from the row's reduction to the write (kForwardHeld of x, kDxHeld of dy and of
//   x), so the row is read once; packs past those (rows of more than 2048 packs forward, 1024 for
//   dx) are read again. The forward may also measure max |y| for a float8 cast (amax.cuh), one
//   atomic per block.
// - dweight: partial sums over fixed chunks of kChunkRows rows, one block per chunk and tile of
//   32 column packs (lanes over columns, warps over the chunk's rows), then the chunks added. Every
//   sum runs in a fixed order: deterministic, no atomics.
#include <algorithm>
#include <limits>

#include "runtime/cuda/amax.cuh"
#include "runtime/cuda/block_reduce.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/packed.cuh"
#include "runtime/kernels/rms_norm.h"

namespace mt::runtime::cuda {
namespace {

// Packs of a row a thread keeps in registers per operand: the forward holds x's (8 packs of 16
// bytes: a 4 KiB row per warp), dx holds dy's and x's (4 each, within 128 registers).
constexpr int kForwardHeld = 8, kDxHeld = 4;
constexpr int kMaxRowThreads = kThreads;
constexpr int kMinRowBlocks = 2;  // per SM, so at most 128 registers per thread
constexpr int kWarps = kThreads / 32;
constexpr int64_t kChunkRows = 128;

// Whether rows of d elements can be read in packs of V: d a multiple of V, pointers aligned.
template <int V, class... T>
bool rows_packable(int64_t d, const T*... p) {
  return d % V == 0 && packable<V>(p...);
}

// The share of a row of `packs` packs that one thread works on: packs lane, lane + threads,
// lane + 2 * threads, ..., of which the first kHeld are held in registers (HeldRow). The row's
// threads are a warp or the whole block.
template <int kHeld>
struct RowShare {
  int64_t row, packs;
  int lane, threads;

  __device__ RowShare(int threads_per_row, int64_t row_packs)
      : row(int64_t(blockIdx.x) * (blockDim.x / threads_per_row) + threadIdx.x / threads_per_row),
        packs(row_packs),
        lane(int(threadIdx.x) % threads_per_row),
        threads(threads_per_row) {}

  __device__ int64_t pack(int k) const { return lane + int64_t(k) * threads; }

  // f(j, k) for each pack j of the share, k its slot among the held packs (kHeld past them).
  template <class F>
  __device__ void for_each(F f) const {
#pragma unroll
    for (int k = 0; k < kHeld; ++k)
      if (pack(k) < packs) f(pack(k), k);
    for (int64_t j = pack(kHeld); j < packs; j += threads) f(j, kHeld);
  }

  // The sum of v over the row's threads (every one of them must call it).
  template <class A>
  __device__ A sum(A v) const {
    return threads == 32 ? warp_sum(v) : block_sum(v);
  }
};

// One operand's packs of a row share, the first kHeld read once into registers.
template <int kHeld, int V, class T>
struct HeldRow {
  const T* row;
  Pack<T, V> held[kHeld];

  __device__ HeldRow(const T* row_start, const RowShare<kHeld>& s) : row(row_start) {
#pragma unroll
    for (int k = 0; k < kHeld; ++k)
      if (s.pack(k) < s.packs) held[k] = load_pack<V>(row, s.pack(k));
  }

  // Pack j of slot k (RowShare::for_each): from registers, or read again past the held ones.
  __device__ Pack<T, V> operator()(int64_t j, int k) const {
    return k < kHeld ? held[k] : load_pack<V>(row, j);
  }
};

// Row s.row of y and rstd; returns max |y| as stored (amax.cuh) over this thread's share when
// `measure`, else 0.
template <int V, class T, class A>
__device__ unsigned forward_row(const RowShare<kForwardHeld>& s, const T* x, const T* w,
                                double eps, int64_t d, T* y, A* rstd, bool measure) {
  const HeldRow<kForwardHeld, V, T> xs(x + s.row * d, s);
  A ss = 0;
  s.for_each([&](int64_t j, int k) {
    const Pack<T, V> xp = xs(j, k);
#pragma unroll
    for (int e = 0; e < V; ++e) ss += A(xp.v[e]) * A(xp.v[e]);
  });
  ss = s.sum(ss);
  const A rs = A(1) / sqrt(ss / A(d) + A(eps));
  if (s.lane == 0) rstd[s.row] = rs;
  T* yr = y + s.row * d;
  unsigned y_max = 0;
  s.for_each([&](int64_t j, int k) {
    const Pack<T, V> xp = xs(j, k), wp = load_pack<V>(w, j);
    Pack<T, V> yp;
#pragma unroll
    for (int e = 0; e < V; ++e) yp.v[e] = T(A(xp.v[e]) * rs * A(wp.v[e]));
    store_pack<V>(yr, j, yp);
    if (measure) {
#pragma unroll
      for (int e = 0; e < V; ++e) y_max = max(y_max, abs_bits(float(yp.v[e])));
    }
  });
  return y_max;
}

// amax (nullable): raised to max |y| as stored, once per block.
template <int V, class T, class A>
__global__ void __launch_bounds__(kMaxRowThreads, kMinRowBlocks)
    forward_rows(const T* x, const T* w, double eps, int64_t rows, int64_t d, int threads_per_row,
                 T* y, A* rstd, unsigned* amax) {
  const RowShare<kForwardHeld> s(threads_per_row, d / V);
  // Past the last row: whole warps (a row per block when the row is the block's), which stay for
  // the block's amax.
  const unsigned y_max =
      s.row < rows ? forward_row<V>(s, x, w, eps, d, y, rstd, amax != nullptr) : 0u;
  if (amax) raise_amax_over_block(y_max, amax);
}

template <int V, class T, class A>
__global__ void __launch_bounds__(kMaxRowThreads, kMinRowBlocks)
    dx_rows(const T* dy, const T* x, const T* w, const A* rstd, int64_t rows, int64_t d,
            int threads_per_row, T* dx) {
  const RowShare<kDxHeld> s(threads_per_row, d / V);
  if (s.row >= rows) return;
  const HeldRow<kDxHeld, V, T> gs(dy + s.row * d, s), xs(x + s.row * d, s);
  const A rs = rstd[s.row];
  A dot = 0;
  s.for_each([&](int64_t j, int k) {
    const Pack<T, V> gp = gs(j, k), xp = xs(j, k), wp = load_pack<V>(w, j);
#pragma unroll
    for (int e = 0; e < V; ++e) dot += A(gp.v[e]) * A(wp.v[e]) * A(xp.v[e]);
  });
  dot = s.sum(dot);
  const A coef = rs * rs * rs * dot / A(d);
  T* dxr = dx + s.row * d;
  s.for_each([&](int64_t j, int k) {
    const Pack<T, V> gp = gs(j, k), xp = xs(j, k), wp = load_pack<V>(w, j);
    Pack<T, V> dp;
#pragma unroll
    for (int e = 0; e < V; ++e) dp.v[e] = T(rs * A(gp.v[e]) * A(wp.v[e]) - coef * A(xp.v[e]));
    store_pack<V>(dxr, j, dp);
  });
}

// Launch geometry of forward_rows and dx_rows: enough threads per row that each holds at most
// `held` packs, a warp at least (then kWarps rows per block), at most kMaxRowThreads.
struct RowLaunch {
  unsigned blocks;
  int threads, threads_per_row;

  RowLaunch(int64_t rows, int64_t packs, int held) {
    const int64_t warps_needed = (packs + 32 * held - 1) / (32 * held);
    threads_per_row = int(std::min<int64_t>(warps_needed, kMaxRowThreads / 32)) * 32;
    threads = threads_per_row == 32 ? kThreads : threads_per_row;
    const int64_t rows_per_block = threads / threads_per_row;
    blocks = unsigned((rows + rows_per_block - 1) / rows_per_block);
  }
};

template <int V, class T, class A>
void launch_forward(const T* x, const T* w, double eps, int64_t rows, int64_t d, T* y, A* rstd,
                    unsigned* amax) {
  const RowLaunch l(rows, d / V, kForwardHeld);
  forward_rows<V><<<l.blocks, l.threads, 0, current_stream()>>>(x, w, eps, rows, d,
                                                                l.threads_per_row, y, rstd, amax);
  MT_CUDA_CHECK_LAUNCH();
}

template <int V, class T, class A>
void launch_dx(const T* dy, const T* x, const T* w, const A* rstd, int64_t rows, int64_t d, T* dx) {
  const RowLaunch l(rows, d / V, kDxHeld);
  dx_rows<V><<<l.blocks, l.threads, 0, current_stream()>>>(dy, x, w, rstd, rows, d,
                                                           l.threads_per_row, dx);
  MT_CUDA_CHECK_LAUNCH();
}

// Adds each lane's values over the block's kWarps warps in warp order (deterministic); warp 0
// gets the sums. Every thread of the block (kThreads) must call it, at most once per kernel.
template <int N, class A>
__device__ inline void sum_over_warps(A (&v)[N]) {
  __shared__ A others[kWarps - 1][N][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp > 0) {
#pragma unroll
    for (int e = 0; e < N; ++e) others[warp - 1][e][lane] = v[e];
  }
  __syncthreads();
  if (warp == 0) {
    for (int w = 0; w < kWarps - 1; ++w) {
#pragma unroll
      for (int e = 0; e < N; ++e) v[e] += others[w][e][lane];
    }
  }
}

// partial[chunk, columns of pack j] = sum over the chunk's rows of dy * x * rstd. Block b: chunk
// b / col_tiles, column packs 32 * (b % col_tiles) + lane; warp w adds rows w, w + kWarps, ...
template <int V, class T, class A>
__global__ void dweight_partial(const T* dy, const T* x, const A* rstd, int64_t rows, int64_t d,
                                int64_t col_tiles, A* partial) {
  const int64_t chunk = blockIdx.x / col_tiles;
  const int64_t j = blockIdx.x % col_tiles * 32 + threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const bool in_row = j < d / V;  // no early return: every thread reaches sum_over_warps
  A acc[V] = {};
  if (in_row) {
    const int64_t end = min(rows, (chunk + 1) * kChunkRows);
#pragma unroll 4
    for (int64_t r = chunk * kChunkRows + warp; r < end; r += kWarps) {
      const Pack<T, V> gp = load_pack<V>(dy + r * d, j), xp = load_pack<V>(x + r * d, j);
      const A rs = rstd[r];
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += A(gp.v[e]) * A(xp.v[e]) * rs;
    }
  }
  sum_over_warps(acc);
  if (warp == 0 && in_row) {
    Pack<A, V> p;
#pragma unroll
    for (int e = 0; e < V; ++e) p.v[e] = acc[e];
    store_pack<V>(partial + chunk * d, j, p);
  }
}

// dw[i] = sum over chunks of partial[chunk, i]: block b has columns 32 * b + lane, warp w adds
// chunks w, w + kWarps, ...
template <class T, class A>
__global__ void dweight_sum(const A* partial, int64_t chunks, int64_t d, T* dw) {
  const int64_t i = int64_t(blockIdx.x) * 32 + threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  A acc[1] = {};
  if (i < d) {
    for (int64_t c = warp; c < chunks; c += kWarps) acc[0] += partial[c * d + i];
  }
  sum_over_warps(acc);
  if (warp == 0 && i < d) dw[i] = T(acc[0]);
}

template <int V, class T, class A>
void launch_dweight(const T* dy, const T* x, const A* rstd, int64_t rows, int64_t d, int64_t chunks,
                    A* partial, T* dw) {
  const int64_t col_tiles = (d / V + 31) / 32;
  MT_CHECK(chunks * col_tiles <= std::numeric_limits<int32_t>::max(), "rms_norm_backward: ", rows,
           " rows of ", d, " features exceed the kernel's limit");
  dweight_partial<V><<<unsigned(chunks * col_tiles), kThreads, 0, current_stream()>>>(
      dy, x, rstd, rows, d, col_tiles, partial);
  MT_CUDA_CHECK_LAUNCH();
  dweight_sum<<<unsigned((d + 31) / 32), kThreads, 0, current_stream()>>>(partial, chunks, d, dw);
  MT_CUDA_CHECK_LAUNCH();
}

void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd,
                      Tensor& y_amax) {
  check_on_current_device(x, "rms_norm");
  const int64_t d = weight.numel(), rows = x.numel() / d;
  if (rows == 0) return;
  unsigned* amax = y_amax.defined() ? ptr<unsigned>(y_amax) : nullptr;  // f32 slot, as its bits
  MT_CUDA_DISPATCH_FLOATING(x.dtype(), "rms_norm", T, [&] {
    using A = acc_t<T>;
    constexpr int V = pack_width<T>();
    const T *xp = ptr<T>(x), *wp = ptr<T>(weight);
    T* yp = ptr<T>(y);
    if (rows_packable<V>(d, xp, wp, yp))
      launch_forward<V>(xp, wp, eps, rows, d, yp, ptr<A>(rstd), amax);
    else
      launch_forward<1>(xp, wp, eps, rows, d, yp, ptr<A>(rstd), amax);
  });
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       Tensor& dx, Tensor& dweight) {
  check_on_current_device(x, "rms_norm_backward");
  const int64_t d = weight.numel(), rows = x.numel() / d;
  MT_CUDA_DISPATCH_FLOATING(x.dtype(), "rms_norm_backward", T, [&] {
    using A = acc_t<T>;
    constexpr int V = pack_width<T>();
    const T *dyp = ptr<T>(dy), *xp = ptr<T>(x), *wp = ptr<T>(weight);
    const A* rp = ptr<A>(rstd);
    if (dx.defined() && rows > 0) {
      T* dxp = ptr<T>(dx);
      if (rows_packable<V>(d, dyp, xp, wp, dxp))
        launch_dx<V>(dyp, xp, wp, rp, rows, d, dxp);
      else
        launch_dx<1>(dyp, xp, wp, rp, rows, d, dxp);
    }
    if (!dweight.defined()) return;
    if (rows == 0) {
      dweight.zero_();
      return;
    }
    const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
    Tensor partial = Tensor::empty({chunks, d}, x.options().with_dtype(dtype_v<A>));
    A* pp = ptr<A>(partial);
    T* dwp = ptr<T>(dweight);
    if (rows_packable<V>(d, dyp, xp, static_cast<const A*>(pp)))
      launch_dweight<V>(dyp, xp, rp, rows, d, chunks, pp, dwp);
    else
      launch_dweight<1>(dyp, xp, rp, rows, d, chunks, pp, dwp);
  });
}

MT_REGISTER_KERNEL(rms_norm_forward_kernel, DeviceType::CUDA, rms_norm_forward);
MT_REGISTER_KERNEL(rms_norm_backward_kernel, DeviceType::CUDA, rms_norm_backward);

}  // namespace
}  // namespace mt::runtime::cuda
