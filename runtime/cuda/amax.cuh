// The amax of float8 casts on the device: max |value| as the maximum of the values' |bits|
// (positive floats order as their bits, and a NaN's are the largest, so a NaN wins), kept in an
// f32 slot as those bits and raised with atomicMax. Used by the casts' own pass (float8.cu) and
// by kernels that measure what they write (runtime/ops/float8_amax_notes.h).
#pragma once

#include <cuda_runtime.h>

#include "runtime/cuda/block_reduce.cuh"

namespace mt::runtime::cuda {

__device__ inline unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Raises *slot to the maximum of v over the block (every thread of the block calls it).
__device__ inline void raise_amax_over_block(unsigned v, unsigned* slot) {
  v = block_max(v, 0u);
  if (threadIdx.x == 0) atomicMax(slot, v);
}

}  // namespace mt::runtime::cuda
