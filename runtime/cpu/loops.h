// CPU loop helpers shared by the kernels.
//
// strided_loop<N>(shape, {strides of operand 0..N-1}, fn) visits every index of `shape` once,
// calling fn(offsets, count, inner_strides) for runs along the innermost (coalesced) dim:
// offsets[k] is the element offset of the run's first element in operand k, and the run's j-th
// element sits at offsets[k] + j * inner_strides[k]. Dims that are contiguous across operands are
// merged first, so contiguous tensors become one long run. Runs are split over OpenMP threads when
// the work is large; each index is visited by exactly one thread, so elementwise results never
// depend on the thread count.
//
// parallel_for(n, grain, fn) calls fn(begin, end) over [0, n) in chunks on OpenMP threads.
#pragma once

#include <omp.h>

#include <array>
#include <cstdint>
#include <vector>

#include "runtime/core/shape.h"

namespace mt::runtime::cpu {

inline constexpr int64_t kParallelGrain = 32768;  // elements below which loops stay serial

template <class Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  if (n <= grain || omp_get_max_threads() == 1 || omp_in_parallel()) {
    fn(int64_t(0), n);
    return;
  }
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int64_t threads = std::min<int64_t>(omp_get_max_threads(), max_chunks);
#pragma omp parallel num_threads(int(threads))
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    if (begin < end) fn(begin, end);
  }
}

template <size_t N>
struct CoalescedLoop {
  Shape shape;                      // outer dims ..., innermost last
  std::array<Shape, N> strides;     // per operand, aligned with shape
};

template <size_t N>
CoalescedLoop<N> coalesce(const Shape& shape, const std::array<Shape, N>& strides) {
  CoalescedLoop<N> out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;  // size-1 dims contribute nothing
    if (!out.shape.empty()) {
      bool mergeable = true;
      for (size_t k = 0; k < N; ++k)
        mergeable &= out.strides[k].back() == strides[k][d] * shape[d];
      if (mergeable) {
        out.shape.back() *= shape[d];
        for (size_t k = 0; k < N; ++k) out.strides[k].back() = strides[k][d];
        continue;
      }
    }
    out.shape.push_back(shape[d]);
    for (size_t k = 0; k < N; ++k) out.strides[k].push_back(strides[k][d]);
  }
  if (out.shape.empty()) {  // a single element
    out.shape.push_back(1);
    for (size_t k = 0; k < N; ++k) out.strides[k].push_back(0);
  }
  return out;
}

template <size_t N, class Fn>
void strided_loop(const Shape& shape, const std::array<Shape, N>& strides, Fn&& fn) {
  if (numel_of(shape) == 0) return;
  const CoalescedLoop<N> loop = coalesce<N>(shape, strides);
  const int64_t ndim = int64_t(loop.shape.size());
  const int64_t inner = loop.shape.back();
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = loop.strides[k].back();
  const int64_t rows = numel_of(loop.shape) / inner;
  const int64_t grain_rows = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(inner, 1));
  parallel_for(rows, grain_rows, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      std::array<int64_t, N> offsets{};
      int64_t rem = row;
      for (int64_t d = ndim - 2; d >= 0; --d) {
        const int64_t idx = rem % loop.shape[d];
        rem /= loop.shape[d];
        for (size_t k = 0; k < N; ++k) offsets[k] += idx * loop.strides[k][d];
      }
      fn(offsets, inner, inner_strides);
    }
  });
}

}  // namespace mt::runtime::cpu
