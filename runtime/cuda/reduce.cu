// CUDA reduction kernels (runtime/kernels/reduce.h): sum (mean through its divisor) and max with
// indices, over any dims of a strided tensor.
//
// Geometry as on the CPU: x's dims split into kept dims (K outputs, row-major, out contiguous) and
// reduced dims (R elements each), both coalesced. Two schedules, chosen by the shape alone so a
// result never depends on anything else (no atomics; deterministic):
// - one block per output: threads stride over the reduced elements, then a block tree reduction
//   (reduced dims that are the fast ones: loads are coalesced);
// - one thread per output walking its elements in order: when the innermost kept dim is the
//   contiguous one (a bias gradient: [N, C] summed over N; neighbouring threads load neighbours),
//   or when R is small.
// When that leaves the GPU mostly idle (few outputs of many elements: a whole-tensor sum such as
// a gradient norm, or a column sum of a tall matrix) the reduced range is split into C chunks of
// L consecutive elements (C and L from the shape alone): pass 1 reduces every (output, chunk)
// with the schedule above into a partial, pass 2 combines each output's partials in chunk order.
// Sums accumulate in f64 for floating dtypes (the CPU's contract) and in wrapping u64 for
// integers; the order differs from the CPU's, so floating sums agree to rounding, not bitwise.
// max is exact: the first maximum in row-major order, the first NaN beating everything.
#include <vector>

#include "runtime/cuda/block_reduce.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/reduce.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::cuda {
namespace {

constexpr int kBlock = 256;

struct Dims {
  int n = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  // Element offset of row-major index i.
  __device__ inline int64_t offset(int64_t i) const {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; --d) {
      off += (i % sizes[d]) * strides[d];
      i /= sizes[d];
    }
    return off;
  }
};

struct Geometry {
  Dims kept, red;
  int64_t K = 1, R = 1;
  bool per_thread = false;  // one thread per output (else one block per output)
  int64_t chunks = 1;       // C: pieces of the reduced range (1: no split, no pass 2)
  int64_t chunk_len = 1;    // L: elements per piece (the last may be shorter)

  // Work item w of pass 1 -> (output k, chunk c). Per-thread items put neighbouring outputs on
  // neighbouring threads (coalesced column loads); per-block items keep an output's chunks
  // together. The partial of (k, c) is stored at index w.
  __host__ __device__ int64_t output_of(int64_t w) const { return per_thread ? w % K : w / chunks; }
  __host__ __device__ int64_t chunk_of(int64_t w) const { return per_thread ? w / K : w % chunks; }
  __host__ __device__ int64_t partial_index(int64_t k, int64_t c) const {
    return per_thread ? c * K + k : k * chunks + c;
  }
  __host__ __device__ int64_t items() const { return K * chunks; }
};

// Chunks so that pass 1 has enough independent work (about 1024 blocks, or 256k threads) while
// each chunk stays long enough to amortise its partial (>= 32k elements per block, >= 256 per
// thread).
void split_reduced_range(Geometry& g) {
  const int64_t min_len = g.per_thread ? 256 : 32768;
  const int64_t target_items = g.per_thread ? (int64_t(1) << 18) : 1024;
  if (g.R < 2 * min_len || g.K >= target_items) return;
  const int64_t by_work = (g.R + min_len - 1) / min_len;
  const int64_t by_parallelism = (target_items + g.K - 1) / g.K;
  const int64_t c = std::max<int64_t>(1, std::min({by_work, by_parallelism, int64_t(4096)}));
  g.chunk_len = (g.R + c - 1) / c;
  g.chunks = (g.R + g.chunk_len - 1) / g.chunk_len;  // every chunk non-empty
}

Geometry make_geometry(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<bool> reduced(size_t(x.dim()), false);
  for (int64_t d : dims) reduced[size_t(d)] = true;
  auto push = [&x](Dims& g, int64_t size, int64_t stride) {
    if (size == 1) return;
    if (g.n > 0 && g.strides[g.n - 1] == stride * size) {
      g.sizes[g.n - 1] *= size;
      g.strides[g.n - 1] = stride;
      return;
    }
    MT_CHECK(g.n < kMaxDims, "sum/max: too many non-mergeable dims in shape ", x.shape());
    g.sizes[g.n] = size;
    g.strides[g.n] = stride;
    ++g.n;
  };
  Geometry g;
  for (int64_t d = 0; d < x.dim(); ++d)
    push(reduced[size_t(d)] ? g.red : g.kept, x.size(d), x.stride(d));
  for (int d = 0; d < g.kept.n; ++d) g.K *= g.kept.sizes[d];
  for (int d = 0; d < g.red.n; ++d) g.R *= g.red.sizes[d];
  const bool column = g.kept.n > 0 && g.kept.strides[g.kept.n - 1] == 1 &&
                      (g.red.n == 0 || g.red.strides[g.red.n - 1] != 1) && g.K >= 1024;
  g.per_thread = column || g.R <= 32;
  g.chunk_len = g.R;
  split_reduced_range(g);
  return g;
}

unsigned grid_for(int64_t blocks) { return unsigned(std::min<int64_t>(blocks, 1 << 20)); }

// Scratch for pass 1's partials: `count` values of up to 8 bytes each, on the compute stream.
Tensor partials_buffer(const Tensor& like, int64_t count) {
  return empty({count}, like.options().with_dtype(DType::I64));
}

// ---- sum ---------------------------------------------------------------------------------------

template <class T>
using SumAcc = std::conditional_t<std::is_floating_point_v<acc_t<T>>, double, unsigned long long>;
template <class T>
using SumOut = std::conditional_t<std::is_floating_point_v<acc_t<T>>, T, int64_t>;

template <class T>
__device__ inline SumAcc<T> load_sum(T v) {
  if constexpr (std::is_floating_point_v<acc_t<T>>) {
    return double(acc_t<T>(v));
  } else {
    return (unsigned long long)(int64_t(v));  // wraps; bool -> 0/1
  }
}

template <class T>
__device__ inline SumOut<T> finish_sum(SumAcc<T> total, double divisor) {
  if constexpr (std::is_floating_point_v<acc_t<T>>) {
    return convert<T>(acc_t<T>(divisor == 1.0 ? total : total / divisor));
  } else {
    return int64_t(total);
  }
}

// Pass 1 (or the whole reduction when g.chunks == 1): item w sums its output's chunk into out
// (one chunk) or into partial[w].
template <class T>
__global__ void sum_blocks(const T* x, Geometry g, double divisor, SumOut<T>* out,
                           SumAcc<T>* partial) {
  for (int64_t w = blockIdx.x; w < g.items(); w += gridDim.x) {
    const int64_t k = g.output_of(w), r0 = g.chunk_of(w) * g.chunk_len;
    const int64_t r1 = min(g.R, r0 + g.chunk_len);
    const T* base = x + g.kept.offset(k);
    SumAcc<T> acc = 0;
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x)
      acc += load_sum(base[g.red.offset(r)]);
    acc = block_sum(acc);
    if (threadIdx.x != 0) continue;
    if (g.chunks == 1) {
      out[k] = finish_sum<T>(acc, divisor);
    } else {
      partial[w] = acc;
    }
  }
}

template <class T>
__global__ void sum_threads(const T* x, Geometry g, double divisor, SumOut<T>* out,
                            SumAcc<T>* partial) {
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < g.items();
       w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = g.output_of(w), r0 = g.chunk_of(w) * g.chunk_len;
    const int64_t r1 = min(g.R, r0 + g.chunk_len);
    const T* base = x + g.kept.offset(k);
    SumAcc<T> acc = 0;
    for (int64_t r = r0; r < r1; ++r) acc += load_sum(base[g.red.offset(r)]);
    if (g.chunks == 1) {
      out[k] = finish_sum<T>(acc, divisor);
    } else {
      partial[w] = acc;
    }
  }
}

// Pass 2: each output's partials added in chunk order.
template <class T>
__global__ void sum_partials(Geometry g, double divisor, const SumAcc<T>* partial, SumOut<T>* out) {
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < g.K;
       k += int64_t(gridDim.x) * blockDim.x) {
    SumAcc<T> acc = 0;
    for (int64_t c = 0; c < g.chunks; ++c) acc += partial[g.partial_index(k, c)];
    out[k] = finish_sum<T>(acc, divisor);
  }
}

void sum_reduce(const Tensor& x, const std::vector<int64_t>& dims, double divisor,
                const Tensor& out) {
  check_on_current_device(x, "sum");
  check_on_current_device(out, "sum");
  MT_CUDA_DISPATCH_ALL(x.dtype(), "sum", T, [&] {
    using Out = SumOut<T>;
    MT_CHECK(out.dtype() == (std::is_same_v<Out, int64_t> ? DType::I64 : x.dtype()) &&
                 out.is_contiguous(),
             "sum: bad output");
    Out* o = ptr<Out>(out);
    if (x.numel() == 0 || out.numel() == 0) {  // sums over nothing are 0 (mean: 0/0 = NaN)
      launch_linear(out.numel(),
                    [=] __device__(int64_t k) { o[k] = finish_sum<T>(SumAcc<T>(0), divisor); });
      return;
    }
    const Geometry g = make_geometry(x, dims);
    const Tensor scratch = g.chunks > 1 ? partials_buffer(x, g.items()) : Tensor();
    SumAcc<T>* partial = g.chunks > 1 ? ptr<SumAcc<T>>(scratch) : nullptr;
    if (g.per_thread) {
      sum_threads<T><<<blocks_for(g.items()), kThreads, 0, current_stream()>>>(ptr<T>(x), g,
                                                                               divisor, o, partial);
    } else {
      sum_blocks<T>
          <<<grid_for(g.items()), kBlock, 0, current_stream()>>>(ptr<T>(x), g, divisor, o, partial);
    }
    MT_CUDA_CHECK_LAUNCH();
    if (g.chunks > 1) {
      sum_partials<T><<<blocks_for(g.K), kThreads, 0, current_stream()>>>(g, divisor, partial, o);
      MT_CUDA_CHECK_LAUNCH();
    }
  });
}

// ---- max ---------------------------------------------------------------------------------------

// v beats best: larger, or the first NaN (the CPU's `better`).
template <class C>
__device__ inline bool better(C v, C best) {
  if constexpr (std::is_floating_point_v<C>) {
    return v > best || (v != v && best == best);
  } else {
    return v > best;
  }
}

template <class T>
__device__ inline void write_max(int64_t k, acc_t<T> b, int64_t bi, T* values, int64_t* indices) {
  if (values) values[k] = convert<T>(b);
  if (indices) indices[k] = bi;
}

// Where pass 1 of a split max leaves each (output, chunk)'s winner.
template <class C>
struct MaxPartials {
  C* values = nullptr;
  int64_t* indices = nullptr;
};

// One winner (value b, index bi of the reduced range): the output's, or a chunk's partial.
template <class T>
__device__ inline void put_max(const Geometry& g, int64_t w, int64_t k, acc_t<T> b, int64_t bi,
                               T* values, int64_t* indices, MaxPartials<acc_t<T>> partial) {
  if (g.chunks == 1) {
    write_max<T>(k, b, bi, values, indices);
  } else {
    partial.values[w] = b;
    partial.indices[w] = bi;
  }
}

template <class T>
__global__ void max_blocks(const T* x, Geometry g, T* values, int64_t* indices,
                           MaxPartials<acc_t<T>> partial) {
  using C = acc_t<T>;
  __shared__ C sv[kBlock];
  __shared__ int64_t si[kBlock];
  for (int64_t w = blockIdx.x; w < g.items(); w += gridDim.x) {
    const int64_t k = g.output_of(w), r0 = g.chunk_of(w) * g.chunk_len;
    const int64_t r1 = min(g.R, r0 + g.chunk_len);
    const T* base = x + g.kept.offset(k);
    C b = C(0);
    int64_t bi = -1;  // -1: this thread saw no element
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
      const C v = C(base[g.red.offset(r)]);
      if (bi < 0 || better(v, b)) b = v, bi = r;
    }
    __syncthreads();  // the previous output's reads of sv/si are done
    sv[threadIdx.x] = b;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
      if (threadIdx.x < s) {
        const C ov = sv[threadIdx.x + s];
        const int64_t oi = si[threadIdx.x + s];
        const C mv = sv[threadIdx.x];
        const int64_t mi = si[threadIdx.x];
        // The other wins when it exists and (mine does not, or it is better, or tied and first).
        const bool take = oi >= 0 && (mi < 0 || better(ov, mv) || (!better(mv, ov) && oi < mi));
        if (take) sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) put_max<T>(g, w, k, sv[0], si[0], values, indices, partial);
  }
}

template <class T>
__global__ void max_threads(const T* x, Geometry g, T* values, int64_t* indices,
                            MaxPartials<acc_t<T>> partial) {
  using C = acc_t<T>;
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < g.items();
       w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = g.output_of(w), r0 = g.chunk_of(w) * g.chunk_len;
    const int64_t r1 = min(g.R, r0 + g.chunk_len);
    const T* base = x + g.kept.offset(k);
    C b = C(base[g.red.offset(r0)]);
    int64_t bi = r0;
    for (int64_t r = r0 + 1; r < r1; ++r) {
      const C v = C(base[g.red.offset(r)]);
      if (better(v, b)) b = v, bi = r;
    }
    put_max<T>(g, w, k, b, bi, values, indices, partial);
  }
}

// Pass 2: chunks in order; a later chunk wins only when strictly better, so the first maximum
// (and the first NaN) in row-major order is kept, as without the split.
template <class T>
__global__ void max_partials(Geometry g, MaxPartials<acc_t<T>> partial, T* values,
                             int64_t* indices) {
  using C = acc_t<T>;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < g.K;
       k += int64_t(gridDim.x) * blockDim.x) {
    C b = partial.values[g.partial_index(k, 0)];
    int64_t bi = partial.indices[g.partial_index(k, 0)];
    for (int64_t c = 1; c < g.chunks; ++c) {
      const C v = partial.values[g.partial_index(k, c)];
      if (better(v, b)) b = v, bi = partial.indices[g.partial_index(k, c)];
    }
    write_max<T>(k, b, bi, values, indices);
  }
}

void max_reduce(const Tensor& x, const std::vector<int64_t>& dims, const Tensor& values,
                const Tensor& indices) {
  check_on_current_device(x, "max");
  check_on_current_device(values, "max");
  check_on_current_device(indices, "max");
  const Geometry g = make_geometry(x, dims);
  if (g.K == 0) return;
  MT_CHECK(g.R > 0, "max: cannot reduce over zero elements (shape ", x.shape(), ")");
  MT_CUDA_DISPATCH_ALL(x.dtype(), "max", T, [&] {
    T* v = values.defined() ? ptr<T>(values) : nullptr;
    int64_t* i = indices.defined() ? ptr<int64_t>(indices) : nullptr;
    Tensor scratch_values, scratch_indices;
    MaxPartials<acc_t<T>> partial;
    if (g.chunks > 1) {
      scratch_values = partials_buffer(x, g.items());
      scratch_indices = partials_buffer(x, g.items());
      partial = {ptr<acc_t<T>>(scratch_values), ptr<int64_t>(scratch_indices)};
    }
    if (g.per_thread) {
      max_threads<T>
          <<<blocks_for(g.items()), kThreads, 0, current_stream()>>>(ptr<T>(x), g, v, i, partial);
    } else {
      max_blocks<T>
          <<<grid_for(g.items()), kBlock, 0, current_stream()>>>(ptr<T>(x), g, v, i, partial);
    }
    MT_CUDA_CHECK_LAUNCH();
    if (g.chunks > 1) {
      max_partials<T><<<blocks_for(g.K), kThreads, 0, current_stream()>>>(g, partial, v, i);
      MT_CUDA_CHECK_LAUNCH();
    }
  });
}

MT_REGISTER_KERNEL(sum_kernel, DeviceType::CUDA, sum_reduce);
MT_REGISTER_KERNEL(max_kernel, DeviceType::CUDA, max_reduce);

}  // namespace
}  // namespace mt::runtime::cuda
