// Dispatch helpers shared by the CUDA index, embedding and sort kernels:
//   MT_CUDA_DISPATCH_INDEX(dtype, "op", I, [&] { ... })  I = int32_t or int64_t (index tensors);
//   MT_CUDA_DISPATCH_BYTES(element_size, "op", E, [&] { ... })  E = an unsigned integer of that
//     width, for kernels that only move elements (one instantiation serves every dtype).
#pragma once

#include <cstdint>

#include "runtime/cuda/loops.cuh"

#define MT_CUDA_DISPATCH_INDEX(dtype, op, I, ...)                                          \
  [&] {                                                                                    \
    switch (dtype) {                                                                       \
      MT_CUDA_CASE(I64, int64_t, I, __VA_ARGS__)                                           \
      MT_CUDA_CASE(I32, int32_t, I, __VA_ARGS__)                                           \
      default:                                                                             \
        break;                                                                             \
    }                                                                                      \
    MT_FAIL(op, ": expected an i64 or i32 index, got ", ::mt::runtime::dtype_name(dtype)); \
  }()

#define MT_CUDA_BYTES_CASE(bytes, type, E, ...) \
  case bytes: {                                 \
    using E = type;                             \
    return __VA_ARGS__();                       \
  }
#define MT_CUDA_DISPATCH_BYTES(element_size, op, E, ...)      \
  [&] {                                                       \
    switch (element_size) {                                   \
      MT_CUDA_BYTES_CASE(1, uint8_t, E, __VA_ARGS__)          \
      MT_CUDA_BYTES_CASE(2, uint16_t, E, __VA_ARGS__)         \
      MT_CUDA_BYTES_CASE(4, uint32_t, E, __VA_ARGS__)         \
      MT_CUDA_BYTES_CASE(8, uint64_t, E, __VA_ARGS__)         \
      default:                                                \
        break;                                                \
    }                                                         \
    MT_FAIL(op, ": unsupported element size ", element_size); \
  }()

namespace mt::runtime::cuda {

// Whether an index value lies in [0, size). Kernels skip the others: the index's check has queued
// them as an error for the host (runtime/core/deferred_errors.h), which does not wait for it.
__host__ __device__ inline bool in_range(int64_t k, int64_t size) { return k >= 0 && k < size; }

}  // namespace mt::runtime::cuda
