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
// Sums accumulate in f64 for floating dtypes (the CPU's contract) and in wrapping u64 for
// integers; the order differs from the CPU's, so floating sums agree to rounding, not bitwise.
// max is exact: the first maximum in row-major order, the first NaN beating everything.
#include <vector>

#include "runtime/cuda/block_reduce.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/reduce.h"

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
};

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
  return g;
}

unsigned grid_for(int64_t blocks) { return unsigned(std::min<int64_t>(blocks, 1 << 20)); }

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

template <class T>
__global__ void sum_blocks(const T* x, Geometry g, double divisor, SumOut<T>* out) {
  for (int64_t k = blockIdx.x; k < g.K; k += gridDim.x) {
    const T* base = x + g.kept.offset(k);
    SumAcc<T> acc = 0;
    for (int64_t r = threadIdx.x; r < g.R; r += blockDim.x) acc += load_sum(base[g.red.offset(r)]);
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[k] = finish_sum<T>(acc, divisor);
  }
}

template <class T>
__global__ void sum_threads(const T* x, Geometry g, double divisor, SumOut<T>* out) {
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < g.K;
       k += int64_t(gridDim.x) * blockDim.x) {
    const T* base = x + g.kept.offset(k);
    SumAcc<T> acc = 0;
    for (int64_t r = 0; r < g.R; ++r) acc += load_sum(base[g.red.offset(r)]);
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
    if (g.per_thread) {
      sum_threads<T><<<blocks_for(g.K), kThreads, 0, current_stream()>>>(ptr<T>(x), g, divisor, o);
    } else {
      sum_blocks<T><<<grid_for(g.K), kBlock, 0, current_stream()>>>(ptr<T>(x), g, divisor, o);
    }
    MT_CUDA_CHECK_LAUNCH();
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

template <class T>
__global__ void max_blocks(const T* x, Geometry g, T* values, int64_t* indices) {
  using C = acc_t<T>;
  __shared__ C sv[kBlock];
  __shared__ int64_t si[kBlock];
  for (int64_t k = blockIdx.x; k < g.K; k += gridDim.x) {
    const T* base = x + g.kept.offset(k);
    C b = C(0);
    int64_t bi = -1;  // -1: this thread saw no element
    for (int64_t r = threadIdx.x; r < g.R; r += blockDim.x) {
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
    if (threadIdx.x == 0) write_max<T>(k, sv[0], si[0], values, indices);
  }
}

template <class T>
__global__ void max_threads(const T* x, Geometry g, T* values, int64_t* indices) {
  using C = acc_t<T>;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < g.K;
       k += int64_t(gridDim.x) * blockDim.x) {
    const T* base = x + g.kept.offset(k);
    C b = C(base[0]);
    int64_t bi = 0;
    for (int64_t r = 1; r < g.R; ++r) {
      const C v = C(base[g.red.offset(r)]);
      if (better(v, b)) b = v, bi = r;
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
    if (g.per_thread) {
      max_threads<T><<<blocks_for(g.K), kThreads, 0, current_stream()>>>(ptr<T>(x), g, v, i);
    } else {
      max_blocks<T><<<grid_for(g.K), kBlock, 0, current_stream()>>>(ptr<T>(x), g, v, i);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

MT_REGISTER_KERNEL(sum_kernel, DeviceType::CUDA, sum_reduce);
MT_REGISTER_KERNEL(max_kernel, DeviceType::CUDA, max_reduce);

}  // namespace
}  // namespace mt::runtime::cuda
