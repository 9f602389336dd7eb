// CUDA kernels of scaled_dot_product_attention (contract in runtime/kernels/attention.h).
//
// bf16/f16 with as many queries as keys (training, a prompt's prefill) go to cuDNN's fused flash
// attention (attention_cudnn.h); f32, f64, queries against a longer KV cache (decoding: T = 1
// and S growing, where every step would build and cache another cuDNN graph), and 16-bit
// configurations cuDNN cannot run (or a build without the cuDNN frontend) use the reference
// kernels below, which read any floating dtype and accumulate in acc_t<T> (f32 for 16-bit).
//
// Reference kernels: a block of kWarps warps per output row; each warp takes every kWarps-th key
// (or query), a dot product is a lane-strided loop plus a warp reduction, and the warps' partial
// results are combined in a fixed order. No atomics, so results are deterministic.
//   forward: one block per (b, query head, query row), online softmax per warp, then merged;
//   dq:      one block per query row, dq_i = scale * sum_j p_ij (dp_ij - delta_i) k_j;
//   dk, dv:  one block per (b, kv head, key), over the group's query heads and visible queries:
//            dv_j = sum_i p_ij dout_i,  dk_j = scale * sum_i p_ij (dp_ij - delta_i) q_i;
// with p_ij = exp(scale q_i.k_j - lse_i), dp_ij = dout_i.v_j, delta_i = dout_i.out_i.
// They take contiguous operands: views (the op passes transposed activations, since cuDNN takes
// them) are copied in and out around them.
#include <limits>

#include "runtime/cuda/attention_cudnn.h"
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/attention.h"
#include "runtime/kernels/copy.h"

namespace mt::runtime::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kBlock = kWarps * 32;
constexpr size_t kMaxSharedBytes = 48 * 1024;

struct Geometry {
  int64_t batch, hq, hkv, group, t, s, d, dv;
  bool causal;
  // Keys [0, key_end(i)) are visible to query i (bottom-right causal alignment, as on the CPU).
  __host__ __device__ int64_t key_end(int64_t i) const {
    if (!causal) return s;
    const int64_t e = i + (s - t) + 1;
    return e < 0 ? 0 : (e > s ? s : e);
  }
  // The first query that sees key j.
  __host__ __device__ int64_t query_begin(int64_t j) const {
    if (!causal) return 0;
    const int64_t b = j - (s - t);
    return b < 0 ? 0 : (b > t ? t : b);
  }
  // The kv row (b * hkv + kv head) of query row block bh = b * hq + h.
  __host__ __device__ int64_t kv_of(int64_t bh) const {
    return (bh / hq) * hkv + (bh % hq) / group;
  }
};

Geometry geometry(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const Shape &qs = q.shape(), &ks = k.shape();
  return {qs[0], qs[1], ks[1], qs[1] / ks[1], qs[2], ks[2], qs[3], v.shape()[3], causal};
}

__device__ inline float exp_of(float x) { return expf(x); }
__device__ inline double exp_of(double x) { return exp(x); }
__device__ inline float log_of(float x) { return logf(x); }
__device__ inline double log_of(double x) { return log(x); }

// The warp's sum of v, the same value on every lane (lane 0's, broadcast).
template <class A>
__device__ inline A warp_sum(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return __shfl_sync(0xffffffffu, v, 0);
}

// Dot product of a row in shared memory (already acc_t) with a row of T in global memory.
template <class T, class A>
__device__ inline A warp_dot(const A* a, const T* b, int64_t n, int lane) {
  A sum = 0;
  for (int64_t x = lane; x < n; x += 32) sum += a[x] * convert<A>(b[x]);
  return warp_sum(sum);
}

template <class T>
__global__ void forward_kernel(Geometry g, acc_t<T> scale, const T* __restrict__ q,
                               const T* __restrict__ k, const T* __restrict__ v,
                               T* __restrict__ out, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  extern __shared__ __align__(16) unsigned char smem[];
  A* qs = reinterpret_cast<A*>(smem);  // [d]
  A* acc = qs + g.d;                   // [kWarps][dv]
  A* ms = acc + kWarps * g.dv;         // [kWarps]
  A* ls = ms + kWarps;                 // [kWarps]
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t rows = g.batch * g.hq * g.t;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t i = row % g.t, bkv = g.kv_of(row / g.t);
    const T* K = k + bkv * g.s * g.d;
    const T* V = v + bkv * g.s * g.dv;
    for (int64_t x = threadIdx.x; x < g.d; x += blockDim.x) qs[x] = convert<A>(q[row * g.d + x]);
    A* a = acc + warp * g.dv;
    for (int64_t x = lane; x < g.dv; x += 32) a[x] = 0;
    __syncthreads();
    A m = kNegInf, l = 0;
    const int64_t kend = g.key_end(i);
    for (int64_t j = warp; j < kend; j += kWarps) {
      const A sc = warp_dot(qs, K + j * g.d, g.d, lane) * scale;
      const A mx = m > sc ? m : sc;
      const A correction = exp_of(m - mx);  // 0 on the warp's first key (m = -inf)
      const A p = exp_of(sc - mx);
      l = l * correction + p;
      for (int64_t x = lane; x < g.dv; x += 32)
        a[x] = a[x] * correction + p * convert<A>(V[j * g.dv + x]);
      m = mx;
    }
    if (lane == 0) {
      ms[warp] = m;
      ls[warp] = l;
    }
    __syncthreads();
    A mx = kNegInf;
    for (int w = 0; w < kWarps; ++w) mx = ms[w] > mx ? ms[w] : mx;
    A total = 0;
    for (int w = 0; w < kWarps; ++w)
      if (ls[w] > 0) total += ls[w] * exp_of(ms[w] - mx);
    for (int64_t x = threadIdx.x; x < g.dv; x += blockDim.x) {
      A o = 0;
      for (int w = 0; w < kWarps; ++w)
        if (ls[w] > 0) o += acc[w * g.dv + x] * exp_of(ms[w] - mx);
      out[row * g.dv + x] = convert<T>(total > 0 ? o / total : A(0));  // 0: no visible key
    }
    if (threadIdx.x == 0) lse[row] = total > 0 ? mx + log_of(total) : kNegInf;
    __syncthreads();  // shared memory is reused by the next row
  }
}

// delta_i = dout_i . out_i, one warp per row.
template <class T>
__global__ void delta_kernel(int64_t rows, int64_t dv, const T* __restrict__ dout,
                             const T* __restrict__ out, acc_t<T>* __restrict__ delta) {
  using A = acc_t<T>;
  const int lane = int(threadIdx.x) % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < rows;
       row += warps) {
    A sum = 0;
    for (int64_t x = lane; x < dv; x += 32)
      sum += convert<A>(dout[row * dv + x]) * convert<A>(out[row * dv + x]);
    sum = warp_sum(sum);
    if (lane == 0) delta[row] = sum;
  }
}

template <class T>
__global__ void dq_kernel(Geometry g, acc_t<T> scale, const T* __restrict__ dout,
                          const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const acc_t<T>* __restrict__ lse, const acc_t<T>* __restrict__ delta,
                          T* __restrict__ dq) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  A* qs = reinterpret_cast<A*>(smem);  // [d]
  A* gs = qs + g.d;                    // [dv]: dout_i
  A* acc = gs + g.dv;                  // [kWarps][d]
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t rows = g.batch * g.hq * g.t;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t i = row % g.t, bkv = g.kv_of(row / g.t);
    const T* K = k + bkv * g.s * g.d;
    const T* V = v + bkv * g.s * g.dv;
    for (int64_t x = threadIdx.x; x < g.d; x += blockDim.x) qs[x] = convert<A>(q[row * g.d + x]);
    for (int64_t x = threadIdx.x; x < g.dv; x += blockDim.x)
      gs[x] = convert<A>(dout[row * g.dv + x]);
    A* a = acc + warp * g.d;
    for (int64_t x = lane; x < g.d; x += 32) a[x] = 0;
    __syncthreads();
    const A row_lse = lse[row], row_delta = delta[row];
    const int64_t kend = g.key_end(i);
    for (int64_t j = warp; j < kend; j += kWarps) {
      const A p = exp_of(warp_dot(qs, K + j * g.d, g.d, lane) * scale - row_lse);
      const A ds = p * (warp_dot(gs, V + j * g.dv, g.dv, lane) - row_delta);
      for (int64_t x = lane; x < g.d; x += 32) a[x] += ds * convert<A>(K[j * g.d + x]);
    }
    __syncthreads();
    for (int64_t x = threadIdx.x; x < g.d; x += blockDim.x) {
      A sum = 0;
      for (int w = 0; w < kWarps; ++w) sum += acc[w * g.d + x];
      dq[row * g.d + x] = convert<T>(scale * sum);
    }
    __syncthreads();
  }
}

template <class T>
__global__ void dkdv_kernel(Geometry g, acc_t<T> scale, const T* __restrict__ dout,
                            const T* __restrict__ q, const T* __restrict__ k,
                            const T* __restrict__ v, const acc_t<T>* __restrict__ lse,
                            const acc_t<T>* __restrict__ delta, T* __restrict__ dk,
                            T* __restrict__ dv) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  A* ks = reinterpret_cast<A*>(smem);  // [d]: k_j
  A* vs = ks + g.d;                    // [dv]: v_j
  A* dka = vs + g.dv;                  // [kWarps][d]
  A* dva = dka + kWarps * g.d;         // [kWarps][dv]
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t keys = g.batch * g.hkv * g.s;
  for (int64_t key = blockIdx.x; key < keys; key += gridDim.x) {
    const int64_t j = key % g.s, bkv = key / g.s;
    const int64_t bh0 = (bkv / g.hkv) * g.hq + (bkv % g.hkv) * g.group;  // the group's first head
    for (int64_t x = threadIdx.x; x < g.d; x += blockDim.x) ks[x] = convert<A>(k[key * g.d + x]);
    for (int64_t x = threadIdx.x; x < g.dv; x += blockDim.x) vs[x] = convert<A>(v[key * g.dv + x]);
    A* dka_w = dka + warp * g.d;
    A* dva_w = dva + warp * g.dv;
    for (int64_t x = lane; x < g.d; x += 32) dka_w[x] = 0;
    for (int64_t x = lane; x < g.dv; x += 32) dva_w[x] = 0;
    __syncthreads();
    // The (query head, query) pairs that see key j: group heads x queries [i0, t).
    const int64_t i0 = g.query_begin(j), per_head = g.t - i0, pairs = g.group * per_head;
    for (int64_t pair = warp; pair < pairs; pair += kWarps) {
      const int64_t row = (bh0 + pair / per_head) * g.t + i0 + pair % per_head;
      const T* Q = q + row * g.d;
      const T* dO = dout + row * g.dv;
      const A p = exp_of(warp_dot(ks, Q, g.d, lane) * scale - lse[row]);
      const A ds = p * (warp_dot(vs, dO, g.dv, lane) - delta[row]);
      for (int64_t x = lane; x < g.dv; x += 32) dva_w[x] += p * convert<A>(dO[x]);
      for (int64_t x = lane; x < g.d; x += 32) dka_w[x] += ds * convert<A>(Q[x]);
    }
    __syncthreads();
    for (int64_t x = threadIdx.x; x < g.d; x += blockDim.x) {
      A sum = 0;
      for (int w = 0; w < kWarps; ++w) sum += dka[w * g.d + x];
      dk[key * g.d + x] = convert<T>(scale * sum);
    }
    for (int64_t x = threadIdx.x; x < g.dv; x += blockDim.x) {
      A sum = 0;
      for (int w = 0; w < kWarps; ++w) sum += dva[w * g.dv + x];
      dv[key * g.dv + x] = convert<T>(sum);
    }
    __syncthreads();
  }
}

// Dynamic shared memory of `elems` accumulator values, checked against the default limit.
size_t shared_bytes(int64_t elems, size_t elem_size, const Geometry& g) {
  const size_t bytes = size_t(elems) * elem_size;
  MT_CHECK(bytes <= kMaxSharedBytes, "scaled_dot_product_attention: head dims D = ", g.d,
           ", Dv = ", g.dv, " are too large for the reference CUDA kernel");
  return bytes;
}

unsigned grid_for(int64_t n) { return unsigned(n < (int64_t(1) << 20) ? n : (int64_t(1) << 20)); }

void check_devices(std::initializer_list<const Tensor*> ts, const char* op) {
  for (const Tensor* t : ts) check_on_current_device(*t, op);
}

void reference_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                       Tensor& out, Tensor& lse) {
  const Geometry g = geometry(q, k, v, causal);
  const int64_t rows = g.batch * g.hq * g.t;
  if (rows == 0) return;
  MT_CUDA_DISPATCH_FLOATING(q.dtype(), "scaled_dot_product_attention", T, [&] {
    using A = acc_t<T>;
    const size_t smem = shared_bytes(g.d + kWarps * (g.dv + 2), sizeof(A), g);
    forward_kernel<T><<<grid_for(rows), kBlock, smem, current_stream()>>>(
        g, A(scale), ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(out), ptr<A>(lse));
    MT_CUDA_CHECK_LAUNCH();
  });
}

void reference_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& dq,
                        Tensor& dk, Tensor& dv) {
  const Geometry g = geometry(q, k, v, causal);
  const int64_t rows = g.batch * g.hq * g.t, keys = g.batch * g.hkv * g.s;
  MT_CUDA_DISPATCH_FLOATING(q.dtype(), "scaled_dot_product_attention_backward", T, [&] {
    using A = acc_t<T>;
    const Tensor delta = Tensor::empty({rows}, lse.options());
    if (rows > 0) {
      delta_kernel<T><<<blocks_for(rows * 32), kThreads, 0, current_stream()>>>(
          rows, g.dv, ptr<T>(dout), ptr<T>(out), ptr<A>(delta));
      MT_CUDA_CHECK_LAUNCH();
    }
    if (dq.defined() && rows > 0) {
      const size_t smem = shared_bytes(g.d + g.dv + kWarps * g.d, sizeof(A), g);
      dq_kernel<T><<<grid_for(rows), kBlock, smem, current_stream()>>>(
          g, A(scale), ptr<T>(dout), ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<A>(lse), ptr<A>(delta),
          ptr<T>(dq));
      MT_CUDA_CHECK_LAUNCH();
    }
    if (dk.defined() && keys > 0) {
      const size_t smem = shared_bytes((kWarps + 1) * (g.d + g.dv), sizeof(A), g);
      dkdv_kernel<T><<<grid_for(keys), kBlock, smem, current_stream()>>>(
          g, A(scale), ptr<T>(dout), ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<A>(lse), ptr<A>(delta),
          ptr<T>(dk), ptr<T>(dv));
      MT_CUDA_CHECK_LAUNCH();
    }
  });
}

bool is_16bit(DType t) { return t == DType::BF16 || t == DType::F16; }

// Whether cuDNN is tried (see the top of the file). Empty problems (no query row, no key, or no
// batch) stay on the reference kernels, which write the CPU's results (out 0, lse -inf, zero
// gradients) without cuDNN.
bool try_cudnn(const Tensor& q, const Tensor& k, const Tensor& v) {
  return is_16bit(q.dtype()) && q.numel() > 0 && k.numel() > 0 && v.numel() > 0 &&
         q.size(-2) == k.size(-2);
}

// The reference kernels take contiguous operands (the op may pass views, see
// attention_takes_views_kernel): views are copied in, and outputs that are views copied out.
Tensor contiguous_in(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.options());
  copy_kernel(t.device(), t, c);
  return c;
}

// A contiguous stand-in for an output that is a view (the output itself otherwise).
Tensor contiguous_out(const Tensor& t) {
  return !t.defined() || t.is_contiguous() ? t : Tensor::empty(t.shape(), t.options());
}

void copy_back(const Tensor& result, const Tensor& out) {
  if (out.defined() && result.data_ptr() != out.data_ptr()) copy_kernel(out.device(), result, out);
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                       Tensor& out, Tensor& lse) {
  check_devices({&q, &k, &v, &out, &lse}, "scaled_dot_product_attention");
  if (try_cudnn(q, k, v) && cudnn_attention_forward(q, k, v, causal, scale, out, lse))
    return;
  Tensor o = contiguous_out(out);
  reference_forward(contiguous_in(q), contiguous_in(k), contiguous_in(v), causal, scale, o, lse);
  copy_back(o, out);
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& dq,
                        Tensor& dk, Tensor& dv) {
  check_devices({&dout, &q, &k, &v, &out, &lse, &dq, &dk, &dv},
                "scaled_dot_product_attention_backward");
  if (try_cudnn(q, k, v) &&
      cudnn_attention_backward(dout, q, k, v, out, lse, causal, scale, dq, dk, dv))
    return;
  Tensor gq = contiguous_out(dq), gk = contiguous_out(dk), gv = contiguous_out(dv);
  reference_backward(contiguous_in(dout), contiguous_in(q), contiguous_in(k), contiguous_in(v),
                     contiguous_in(out), lse, causal, scale, gq, gk, gv);
  copy_back(gq, dq);
  copy_back(gk, dk);
  copy_back(gv, dv);
}

bool takes_16bit(DType) { return true; }  // bf16 and f16
bool takes_views() { return true; }

MT_REGISTER_KERNEL(attention_forward_kernel, DeviceType::CUDA, attention_forward);
MT_REGISTER_KERNEL(attention_backward_kernel, DeviceType::CUDA, attention_backward);
MT_REGISTER_KERNEL(attention_takes_16bit_kernel, DeviceType::CUDA, takes_16bit);
MT_REGISTER_KERNEL(attention_takes_views_kernel, DeviceType::CUDA, takes_views);

}  // namespace
}  // namespace mt::runtime::cuda
