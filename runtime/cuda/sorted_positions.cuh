// Positions 0..n-1 of an index tensor, stably sorted by their index value (cub's radix sort over
// the bits the values need): equal values keep increasing positions, so a kernel can walk each
// run of equal targets and add its contributions in the CPU's order, without atomics. Shared by
// the embedding backward (embedding.cu) and index_add (index.cu).
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include "runtime/cuda/index.cuh"
#include "runtime/cuda/loops.cuh"
#include "runtime/ops/factory.h"

namespace mt::runtime::cuda {

struct SortedPositions {
  Tensor keys;   // i64 [n]: the index values, ascending
  Tensor order;  // i32 [n]: the position each sorted value came from
};

// Values should lie in [0, bound). One outside it (an error the index's check reports to the host
// later, without waiting) becomes `bound` in keys: it sorts after every valid value, so runs of
// valid values stay whole, and kernels skip it. index is contiguous; n < 2^31.
inline SortedPositions sort_positions_by_value(const Tensor& index, int64_t bound, const char* op) {
  const int64_t n = index.numel();
  MT_CHECK(n < (int64_t(1) << 31), op, ": at most 2^31 - 1 indices, got ", n);
  int bits = 1;
  while (bits < 63 && (int64_t(1) << bits) <= bound) ++bits;  // values up to bound itself
  const TensorOptions i64 = index.options().with_dtype(DType::I64);
  Tensor keys_in = empty({n}, i64);
  int64_t* kp = ptr<int64_t>(keys_in);
  MT_CUDA_DISPATCH_INDEX(index.dtype(), op, I, [&] {
    const I* ip = ptr<I>(index);
    launch_linear(n, [=] __device__(int64_t i) {
      const int64_t v = int64_t(ip[i]);
      kp[i] = v < 0 || v >= bound ? bound : v;
    });
  });
  SortedPositions s{empty({n}, i64), empty({n}, index.options().with_dtype(DType::I32))};
  Tensor positions = empty({n}, index.options().with_dtype(DType::I32));
  int32_t* pp = ptr<int32_t>(positions);
  launch_linear(n, [=] __device__(int64_t i) { pp[i] = int32_t(i); });
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ptr<int64_t>(keys_in),
                                                ptr<int64_t>(s.keys), pp, ptr<int32_t>(s.order),
                                                int(n), 0, bits, current_stream()));
  const Tensor temp = empty({int64_t(temp_bytes / 8 + 1)}, i64);
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, ptr<int64_t>(keys_in),
                                                ptr<int64_t>(s.keys), pp, ptr<int32_t>(s.order),
                                                int(n), 0, bits, current_stream()));
  return s;
}

// Threads for a block that walks `inner` contiguous elements: a multiple of a warp, at most 256.
inline int threads_for_inner(int64_t inner) {
  return inner >= 256 ? 256 : int((std::max<int64_t>(inner, 1) + 31) / 32 * 32);
}

}  // namespace mt::runtime::cuda
