// CUDA kernels of gradient clipping over many tensors (runtime/kernels/optim.h), so a 1B-parameter
// model's norm and scaling take a few launches at memory speed instead of a cast, a square, a sum
// and a multiply per parameter.
//   norm_pow: each block reduces kNormBlockElems elements of one tensor (vector loads) to an f64
//     partial in its slot; one block then reduces the slots in order. The slots depend on the
//     sizes alone, so the result is deterministic.
//   scale: each block scales kScaleBlockElems elements of one tensor in place.
#include <cmath>

#include "runtime/cuda/block_reduce.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/multi_tensor.cuh"
#include "runtime/cuda/packed.cuh"
#include "runtime/kernels/optim.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::cuda {
namespace {

constexpr int64_t kNormBlockElems = 16 * 1024;
constexpr int64_t kScaleBlockElems = 8 * 1024;
constexpr int kFinalThreads = 1024;

enum class NormKind { Square, Abs, Max, Pow };  // p = 2, 1, +inf, other

__device__ inline double norm_term(NormKind kind, double x, double p) {
  switch (kind) {
    case NormKind::Square:
      return x * x;
    case NormKind::Abs:
    case NormKind::Max:
      return fabs(x);
    default:
      return pow(fabs(x), p);
  }
}

__device__ inline double norm_combine(NormKind kind, double a, double b) {
  return kind == NormKind::Max ? nan_max(a, b) : a + b;
}

template <class T>
struct TensorTable {
  T* x[kMaxTensorsPerLaunch];
  TensorBlocks blocks;
};

template <class T, int V>
__global__ void norm_pow_partials(const __grid_constant__ TensorTable<const T> a, NormKind kind,
                                  double p, double* slots) {
  int64_t begin, end;
  const T* x = a.x[a.blocks.locate(blockIdx.x, kNormBlockElems, begin, end)];
  double acc = 0;  // every term is >= 0 (or NaN), so 0 is also the max's neutral value
  const int64_t packs_end = begin / V + (end - begin) / V;  // begin is a multiple of V
  for (int64_t i = begin / V + threadIdx.x; i < packs_end; i += blockDim.x) {
    const Pack<T, V> pk = load_pack<V>(x, i);
#pragma unroll
    for (int j = 0; j < V; ++j)
      acc = norm_combine(kind, acc, norm_term(kind, convert<double>(pk.v[j]), p));
  }
  for (int64_t i = packs_end * V + threadIdx.x; i < end; i += blockDim.x)
    acc = norm_combine(kind, acc, norm_term(kind, convert<double>(x[i]), p));
  acc = block_reduce(acc, 0.0, [kind](double u, double v) { return norm_combine(kind, u, v); });
  if (threadIdx.x == 0) slots[blockIdx.x] = acc;
}

__global__ void reduce_slots(const double* slots, int64_t n, NormKind kind, double* out) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc = norm_combine(kind, acc, slots[i]);
  acc = block_reduce(acc, 0.0, [kind](double u, double v) { return norm_combine(kind, u, v); });
  if (threadIdx.x == 0) *out = acc;
}

template <class T, int V>
__global__ void scale_blocks(const __grid_constant__ TensorTable<T> a, const double* scale) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const C s = C(*scale);
  int64_t begin, end;
  T* x = a.x[a.blocks.locate(blockIdx.x, kScaleBlockElems, begin, end)];
  const int64_t packs_end = begin / V + (end - begin) / V;
  for (int64_t i = begin / V + threadIdx.x; i < packs_end; i += blockDim.x) {
    Pack<T, V> pk = load_pack<V>(x, i);
#pragma unroll
    for (int j = 0; j < V; ++j) pk.v[j] = convert<T>(convert<C>(pk.v[j]) * s);
    store_pack<V>(x, i, pk);
  }
  for (int64_t i = packs_end * V + threadIdx.x; i < end; i += blockDim.x)
    x[i] = convert<T>(convert<C>(x[i]) * s);
}

void check_operands(const std::vector<Tensor>& tensors, const char* op) {
  for (const Tensor& t : tensors) {
    check_on_current_device(t, op);
    MT_CHECK(t.is_contiguous() && t.is_floating_point(), op,
             ": expected contiguous floating tensors, got ", t.shape(), " ", t.dtype());
  }
}

// Runs launch(table, width, first_block) for the nonempty tensors of dtype T in `tensors`, up to
// kMaxTensorsPerLaunch per launch, `width` the pack width (launch_blocks: pack_width<T>, or 1
// when a pointer is not aligned for it). Returns the number of blocks launched.
template <class T, class Elem, class Launch>
int64_t for_each_launch(const std::vector<Tensor>& tensors, DType dtype, int64_t elems_per_block,
                        Launch&& launch) {
  TensorTable<Elem> table;
  int64_t launched = 0;
  auto flush = [&] {
    const int64_t first = launched;
    launched += table.blocks.blocks;
    launch_blocks<pack_width<T>()>(table.blocks, [&](auto width) { launch(table, width, first); });
  };
  for (const Tensor& t : tensors) {
    if (t.dtype() != dtype || t.numel() == 0) continue;
    Elem* p = ptr<T>(t);
    table.x[table.blocks.add(t.numel(), elems_per_block, packable<pack_width<T>()>(p))] = p;
    if (table.blocks.full()) flush();
  }
  flush();
  return launched;
}

NormKind norm_kind(double p) {
  if (std::isinf(p)) return NormKind::Max;
  return p == 2.0 ? NormKind::Square : p == 1.0 ? NormKind::Abs : NormKind::Pow;
}

void norm_pow_multi_tensor(const std::vector<Tensor>& tensors, double norm_type,
                           const Tensor& out) {
  check_operands(tensors, "norm_pow_multi_tensor");
  check_on_current_device(out, "norm_pow_multi_tensor");
  MT_CHECK(out.numel() == 1 && out.dtype() == DType::F64,
           "norm_pow_multi_tensor: expected a one-element f64 output");
  const NormKind kind = norm_kind(norm_type);
  int64_t slot_count = 0;
  for (const Tensor& t : tensors) slot_count += (t.numel() + kNormBlockElems - 1) / kNormBlockElems;
  const Tensor slots = empty({slot_count > 0 ? slot_count : 1}, out.options());
  int64_t filled = 0;  // slots written by the launches of earlier dtypes
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    MT_CUDA_DISPATCH_FLOATING(dtype, "norm_pow_multi_tensor", T, [&] {
      double* base = ptr<double>(slots) + filled;
      filled += for_each_launch<T, const T>(
          tensors, dtype, kNormBlockElems,
          [&](const TensorTable<const T>& table, auto width, int64_t first) {
            norm_pow_partials<T, decltype(width)::value>
                <<<unsigned(table.blocks.blocks), kThreads, 0, current_stream()>>>(
                    table, kind, norm_type, base + first);
            MT_CUDA_CHECK_LAUNCH();
          });
    });
  }
  reduce_slots<<<1, kFinalThreads, 0, current_stream()>>>(ptr<double>(slots), filled, kind,
                                                         ptr<double>(out));
  MT_CUDA_CHECK_LAUNCH();
}

void scale_multi_tensor(const std::vector<Tensor>& tensors, const Tensor& scale) {
  check_operands(tensors, "scale_multi_tensor_");
  check_on_current_device(scale, "scale_multi_tensor_");
  MT_CHECK(scale.numel() == 1 && scale.dtype() == DType::F64,
           "scale_multi_tensor_: expected a one-element f64 scale");
  const double* s = ptr<double>(scale);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    MT_CUDA_DISPATCH_FLOATING(dtype, "scale_multi_tensor_", T, [&] {
      for_each_launch<T, T>(tensors, dtype, kScaleBlockElems,
                            [&](const TensorTable<T>& table, auto width, int64_t) {
                              scale_blocks<T, decltype(width)::value>
                                  <<<unsigned(table.blocks.blocks), kThreads, 0,
                                     current_stream()>>>(table, s);
                              MT_CUDA_CHECK_LAUNCH();
                            });
    });
  }
}

MT_REGISTER_KERNEL(norm_pow_multi_tensor_kernel, DeviceType::CUDA, norm_pow_multi_tensor);
MT_REGISTER_KERNEL(scale_multi_tensor_kernel, DeviceType::CUDA, scale_multi_tensor);

}  // namespace
}  // namespace mt::runtime::cuda
